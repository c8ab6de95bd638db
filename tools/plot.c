/* Training curves: metrics.csv files drawn as loss / accuracy plots (PNG
 * through cairo, SVG written as text with the same layout). Part of the
 * `ember` program, not of libember: the library stays free of a drawing
 * dependency (and of cairo in its pkg-config / CMake package); the program
 * links cairo when the build finds it (EMBER_HAVE_CAIRO) and otherwise
 * reports that plotting is unavailable. */
#include "tools/tools.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef EMBER_HAVE_CAIRO
#include <cairo.h>
#endif

/* ---- metrics.csv ------------------------------------------------------------ */

void em_tool_metrics_free(em_tool_metrics *m)
{
    if (!m) return;
    free(m->epoch);
    free(m->train_loss);
    free(m->train_accuracy);
    free(m->val_loss);
    free(m->val_accuracy);
    memset(m, 0, sizeof *m);
}

/* Splits @p line in place at commas; returns the field count (at most max). */
static int split_csv(char *line, char **f, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return max + 1;
        f[n++] = p;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = 0;
        p = c + 1;
    }
    return n;
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return end != s && *end == 0 && errno != ERANGE;
}

int em_tool_read_metrics(const char *path, em_tool_metrics *out, char *err, size_t nerr)
{
    enum { C_EPOCH, C_TL, C_TA, C_VL, C_VA, NCOL, MAXF = 64 };
    static const char *const want[NCOL] = {"epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy"};
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, nerr, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    char *fld[MAXF + 1];
    int col[NCOL], nhead = 0, cap = 0, lineno = 1, rc = -1;
    if (!fgets(line, sizeof line, f)) {
        snprintf(err, nerr, "%s is empty (expected ember train's metrics.csv)", path);
        goto out;
    }
    line[strcspn(line, "\r\n")] = 0;
    nhead = split_csv(line, fld, MAXF);
    /* no epoch column but an iter one: the Learner's iteration mode (iter >= 0,
     * losses only; the accuracy columns are absent and read as NaN) */
    bool has_epoch = false, has_iter = false;
    for (int i = 0; i < nhead && i < MAXF; i++) {
        has_epoch |= !strcmp(fld[i], "epoch");
        has_iter |= !strcmp(fld[i], "iter");
    }
    const bool iters = !has_epoch && has_iter;
    out->iterations = iters;
    for (int c = 0; c < NCOL; c++) {
        col[c] = -1;
        const char *name = iters && c == C_EPOCH ? "iter" : want[c];
        for (int i = 0; i < nhead && i < MAXF; i++)
            if (!strcmp(fld[i], name)) col[c] = i;
        if (col[c] < 0 && iters && (c == C_TA || c == C_VA)) continue;
        if (col[c] < 0) {
            snprintf(err, nerr, "%s: the header has no '%s' column (expected ember train's metrics.csv: epoch,train_loss,...)",
                     path, want[c]);
            goto out;
        }
    }
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strcspn(line, "\r\n");
        if (line[len] == 0 && !feof(f)) {
            snprintf(err, nerr, "%s line %d: line too long", path, lineno);
            goto out;
        }
        line[len] = 0;
        if (!line[0]) continue;
        int nf = split_csv(line, fld, MAXF);
        if (nf != nhead) {
            snprintf(err, nerr, "%s line %d: %d fields, the header has %d", path, lineno, nf > MAXF ? MAXF : nf, nhead);
            goto out;
        }
        double v[NCOL];
        const char *xname = iters ? "iteration" : "epoch";
        for (int c = 0; c < NCOL; c++) {
            if (col[c] < 0) {
                v[c] = NAN;
                continue;
            }
            if (!parse_double(fld[col[c]], &v[c])) {
                snprintf(err, nerr, "%s line %d: %s '%s' is not a number", path, lineno, iters && c == C_EPOCH ? "iter" : want[c],
                         fld[col[c]]);
                goto out;
            }
        }
        const double x0 = iters ? 0 : 1;
        if (!(v[C_EPOCH] >= x0 && v[C_EPOCH] < 1e12 && v[C_EPOCH] == floor(v[C_EPOCH]))) {
            snprintf(err, nerr, "%s line %d: %s '%s' is not a whole number >= %.0f", path, lineno, xname, fld[col[C_EPOCH]], x0);
            goto out;
        }
        if (out->n > 0 && v[C_EPOCH] <= out->epoch[out->n - 1]) {
            snprintf(err, nerr, "%s line %d: %s %.0f after %s %.0f (they must increase: two runs in one file?)", path, lineno, xname,
                     v[C_EPOCH], xname, out->epoch[out->n - 1]);
            goto out;
        }
        if (out->n == cap) {
            cap = cap ? 2 * cap : 64;
            double **arr[NCOL] = {&out->epoch, &out->train_loss, &out->train_accuracy, &out->val_loss, &out->val_accuracy};
            for (int c = 0; c < NCOL; c++) {
                double *p = realloc(*arr[c], sizeof **arr[c] * (size_t)cap);
                if (!p) {
                    snprintf(err, nerr, "%s: out of memory", path);
                    goto out;
                }
                *arr[c] = p;
            }
        }
        out->epoch[out->n] = v[C_EPOCH];
        out->train_loss[out->n] = v[C_TL];
        out->train_accuracy[out->n] = v[C_TA];
        out->val_loss[out->n] = v[C_VL];
        out->val_accuracy[out->n] = v[C_VA];
        out->n++;
    }
    if (ferror(f)) {
        snprintf(err, nerr, "cannot read %s: %s", path, strerror(errno));
        goto out;
    }
    if (out->n == 0) {
        snprintf(err, nerr, "%s has no epoch rows", path);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    if (rc != 0) em_tool_metrics_free(out);
    return rc;
}

/* The figure and its plot area on it, in pixels. */
enum { PLOT_W = 800, PLOT_H = 500, M_LEFT = 78, M_RIGHT = 24, M_TOP = 46, M_BOTTOM = 58 };

void em_tool_plot_geometry(int *width, int *height, int *left, int *top, int *right, int *bottom)
{
    *width = PLOT_W;
    *height = PLOT_H;
    *left = M_LEFT;
    *top = M_TOP;
    *right = PLOT_W - M_RIGHT;
    *bottom = PLOT_H - M_BOTTOM;
}

#ifdef EMBER_HAVE_CAIRO

/* ---- a canvas drawn by cairo (PNG) or written as SVG text -------------------- */

typedef struct rgb {
    double r, g, b;
} rgb;

/* matplotlib's tab10, the colours trainers' plots usually have */
static const rgb PALETTE[10] = {{0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.839, 0.153, 0.157},
                                {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498},
                                {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812}};
static const rgb BLACK = {0, 0, 0}, GRID = {0.88, 0.88, 0.88}, WHITE = {1, 1, 1}, GREY = {0.35, 0.35, 0.35};

typedef struct canvas {
    cairo_t *cr; /* PNG: draws; SVG: measures text only */
    FILE *svg;   /* non-NULL: SVG output */
} canvas;

static void svg_color(FILE *f, const char *attr, rgb c)
{
    fprintf(f, " %s=\"#%02x%02x%02x\"", attr, (int)lround(c.r * 255), (int)lround(c.g * 255), (int)lround(c.b * 255));
}

static void svg_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
}

static void cv_font(canvas *cv, double size, bool bold)
{
    cairo_select_font_face(cv->cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cv->cr, size);
}

static double cv_text_width(canvas *cv, const char *s, double size, bool bold)
{
    cairo_text_extents_t e;
    cv_font(cv, size, bold);
    cairo_text_extents(cv->cr, s, &e);
    return e.x_advance;
}

/* Text with its baseline at y; anchor 0 = starts at x, 0.5 = centred, 1 = ends at x; vertical: rotated -90 degrees about (x, y). */
static void cv_text(canvas *cv, double x, double y, const char *s, double size, double anchor, bool bold, bool vertical, rgb c)
{
    if (cv->svg) {
        fprintf(cv->svg, "<text x=\"%.2f\" y=\"%.2f\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"%.1f\"", x, y, size);
        if (bold) fputs(" font-weight=\"bold\"", cv->svg);
        fprintf(cv->svg, " text-anchor=\"%s\"", anchor < 0.25 ? "start" : anchor > 0.75 ? "end" : "middle");
        if (vertical) fprintf(cv->svg, " transform=\"rotate(-90 %.2f %.2f)\"", x, y);
        svg_color(cv->svg, "fill", c);
        fputc('>', cv->svg);
        svg_escape(cv->svg, s);
        fputs("</text>\n", cv->svg);
        return;
    }
    cairo_t *cr = cv->cr;
    double w = cv_text_width(cv, s, size, bold);
    cairo_save(cr);
    cairo_translate(cr, x, y);
    if (vertical) cairo_rotate(cr, -M_PI / 2);
    cairo_move_to(cr, -anchor * w, 0);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_show_text(cr, s);
    cairo_restore(cr);
}

static void cv_line(canvas *cv, double x0, double y0, double x1, double y1, rgb c, double width)
{
    if (cv->svg) {
        fprintf(cv->svg, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke-width=\"%.2f\"", x0, y0, x1, y1, width);
        svg_color(cv->svg, "stroke", c);
        fputs("/>\n", cv->svg);
        return;
    }
    cairo_set_source_rgb(cv->cr, c.r, c.g, c.b);
    cairo_set_line_width(cv->cr, width);
    cairo_move_to(cv->cr, x0, y0);
    cairo_line_to(cv->cr, x1, y1);
    cairo_stroke(cv->cr);
}

static void cv_rect(canvas *cv, double x, double y, double w, double h, const rgb *fill, const rgb *stroke, double width)
{
    if (cv->svg) {
        fprintf(cv->svg, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"", x, y, w, h);
        if (fill) svg_color(cv->svg, "fill", *fill);
        else fputs(" fill=\"none\"", cv->svg);
        if (stroke) {
            svg_color(cv->svg, "stroke", *stroke);
            fprintf(cv->svg, " stroke-width=\"%.2f\"", width);
        }
        fputs("/>\n", cv->svg);
        return;
    }
    cairo_rectangle(cv->cr, x, y, w, h);
    if (fill) {
        cairo_set_source_rgb(cv->cr, fill->r, fill->g, fill->b);
        if (stroke) cairo_fill_preserve(cv->cr);
        else cairo_fill(cv->cr);
    }
    if (stroke) {
        cairo_set_source_rgb(cv->cr, stroke->r, stroke->g, stroke->b);
        cairo_set_line_width(cv->cr, width);
        cairo_stroke(cv->cr);
    }
}

/* One curve: a polyline through the finite points (a NaN breaks it) with a
 * dot on every point; SVG: one <path class="curve"> and the dots in a <g>. */
static void cv_curve(canvas *cv, const double *px, const double *py, int n, rgb c, bool dashed, const char *name)
{
    const double width = 2.0, dot = n <= 3 ? 4.5 : 2.6; /* a few epochs: dots big enough to see */
    if (cv->svg) {
        fputs("<path class=\"curve\" data-name=\"", cv->svg);
        svg_escape(cv->svg, name);
        fputs("\" fill=\"none\" stroke-width=\"2\" stroke-linejoin=\"round\"", cv->svg);
        svg_color(cv->svg, "stroke", c);
        if (dashed) fputs(" stroke-dasharray=\"7,4\"", cv->svg);
        fputs(" d=\"", cv->svg);
        bool pen = false;
        for (int i = 0; i < n; i++) {
            if (!isfinite(py[i])) {
                pen = false;
                continue;
            }
            fprintf(cv->svg, "%s%.2f,%.2f ", pen ? "L" : "M", px[i], py[i]);
            pen = true;
        }
        fputs("\"/>\n<g class=\"markers\"", cv->svg);
        svg_color(cv->svg, "fill", c);
        fputs(">", cv->svg);
        for (int i = 0; i < n; i++)
            if (isfinite(py[i])) fprintf(cv->svg, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%.1f\"/>", px[i], py[i], dot);
        fputs("</g>\n", cv->svg);
        return;
    }
    cairo_t *cr = cv->cr;
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, width);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    const double dash[2] = {7, 4};
    cairo_set_dash(cr, dash, dashed ? 2 : 0, 0);
    bool pen = false;
    for (int i = 0; i < n; i++) {
        if (!isfinite(py[i])) {
            pen = false;
            continue;
        }
        if (pen) cairo_line_to(cr, px[i], py[i]);
        else cairo_move_to(cr, px[i], py[i]);
        pen = true;
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    for (int i = 0; i < n; i++)
        if (isfinite(py[i])) {
            cairo_new_sub_path(cr);
            cairo_arc(cr, px[i], py[i], dot, 0, 2 * M_PI);
        }
    cairo_fill(cr);
}

/* ---- one figure ------------------------------------------------------------- */

/* 1-2-5 step for about @p target intervals over @p span. */
static double nice_step(double span, int target)
{
    double raw = span / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct curve {
    const double *x, *y;
    int n;
    rgb color;
    bool dashed;
    bool xonly; /* not drawn: gives the frame its epochs when no curve has a finite value */
    char name[300];
} curve;

typedef struct frame {
    double xmin, xmax, ymin, ymax;
} frame;

static frame fit_frame(const curve *cs, int nc, bool unit_range)
{
    frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    for (int k = 0; k < nc; k++)
        for (int i = 0; i < cs[k].n; i++) {
            fr.xmin = fmin(fr.xmin, cs[k].x[i]);
            fr.xmax = fmax(fr.xmax, cs[k].x[i]);
            if (!cs[k].xonly && isfinite(cs[k].y[i])) {
                fr.ymin = fmin(fr.ymin, cs[k].y[i]);
                fr.ymax = fmax(fr.ymax, cs[k].y[i]);
            }
        }
    if (!(fr.xmin <= fr.xmax)) fr.xmin = fr.xmax = 1; /* no epochs */
    if (fr.xmax - fr.xmin < 1) { /* one epoch: centre it */
        fr.xmin -= 0.5;
        fr.xmax += 0.5;
    }
    const double xpad = (fr.xmax - fr.xmin) * 0.03; /* the end points off the frame */
    fr.xmin -= xpad;
    fr.xmax += xpad;
    if (!(fr.ymin <= fr.ymax)) { /* no finite value */
        fr.ymin = 0;
        fr.ymax = 1;
    }
    double pad = (fr.ymax - fr.ymin) * 0.06;
    if (pad <= 0) pad = fmax(fabs(fr.ymax) * 0.05, 0.05);
    fr.ymin -= pad;
    fr.ymax += pad;
    if (unit_range) {
        fr.ymin = fmax(fr.ymin, 0);
        fr.ymax = fmin(fr.ymax, 1);
        if (fr.ymax - fr.ymin < 1e-3) fr.ymin = fr.ymax - 0.01;
    }
    return fr;
}

static void draw_figure(canvas *cv, const curve *cs, int nc, const char *title, const char *xlabel, const char *ylabel, bool legend_bottom,
                        bool unit_range)
{
    const double L = M_LEFT, R = PLOT_W - M_RIGHT, T = M_TOP, B = PLOT_H - M_BOTTOM;
    frame fr = fit_frame(cs, nc, unit_range);
#define PX(v) (L + ((v) - fr.xmin) / (fr.xmax - fr.xmin) * (R - L))
#define PY(v) (B - ((v) - fr.ymin) / (fr.ymax - fr.ymin) * (B - T))
    cv_rect(cv, 0, 0, PLOT_W, PLOT_H, &WHITE, NULL, 0);
    /* grid and ticks */
    char lab[64];
    double ys = nice_step(fr.ymax - fr.ymin, 6);
    int dec = ys >= 1 ? 0 : (int)ceil(-log10(ys) - 1e-9);
    for (double v = ceil(fr.ymin / ys - 1e-9) * ys; v <= fr.ymax + ys * 1e-9; v += ys) {
        double y = PY(v);
        cv_line(cv, L, y, R, y, GRID, 1);
        cv_line(cv, L - 5, y, L, y, BLACK, 1);
        snprintf(lab, sizeof lab, "%.*f", dec, fabs(v) < ys * 1e-6 ? 0.0 : v);
        cv_text(cv, L - 8, y + 4, lab, 12, 1, false, false, BLACK);
    }
    double xs = nice_step(fr.xmax - fr.xmin, 8);
    if (xs < 1) xs = 1;
    for (double v = ceil(fr.xmin / xs - 1e-9) * xs; v <= fr.xmax + 1e-9; v += xs) {
        double x = PX(v);
        cv_line(cv, x, T, x, B, GRID, 1);
        cv_line(cv, x, B, x, B + 5, BLACK, 1);
        snprintf(lab, sizeof lab, "%.0f", fabs(v) < 0.5 ? 0.0 : v); /* no "-0" from a rounding residue */
        cv_text(cv, x, B + 19, lab, 12, 0.5, false, false, BLACK);
    }
    cv_rect(cv, L, T, R - L, B - T, NULL, &BLACK, 1);
    cv_text(cv, (L + R) / 2, PLOT_H - 14, xlabel, 13, 0.5, false, false, BLACK);
    cv_text(cv, 22, (T + B) / 2, ylabel, 13, 0.5, false, true, BLACK);
    cv_text(cv, PLOT_W / 2.0, 28, title, 16, 0.5, true, false, BLACK);
    /* curves */
    double px[4096], py[4096];
    int ndrawn = 0;
    for (int k = 0; k < nc; k++) {
        if (cs[k].xonly) continue;
        ndrawn++;
        int n = cs[k].n < 4096 ? cs[k].n : 4096;
        for (int i = 0; i < n; i++) {
            px[i] = PX(cs[k].x[i]);
            py[i] = isfinite(cs[k].y[i]) ? PY(cs[k].y[i]) : NAN;
        }
        cv_curve(cv, px, py, n, cs[k].color, cs[k].dashed, cs[k].name);
    }
    if (ndrawn == 0) { /* e.g. a diverged run: every value NaN; the frame with a note, no empty legend */
        cv_text(cv, (L + R) / 2, (T + B) / 2 + 5, "no finite values", 14, 0.5, false, false, GREY);
        return;
    }
    /* legend: top right for losses (they fall), bottom right for accuracies (they rise) */
    double wmax = 0;
    for (int k = 0; k < nc; k++) wmax = fmax(wmax, cv_text_width(cv, cs[k].name, 12, false));
    const double row = 18, bw = wmax + 52, bh = nc * row + 10;
    double bx = R - bw - 10, by = legend_bottom ? B - bh - 10 : T + 10;
    const rgb edge = {0.7, 0.7, 0.7};
    cv_rect(cv, bx, by, bw, bh, &WHITE, &edge, 1);
    for (int k = 0; k < nc; k++) {
        double y = by + 5 + row * k + row / 2;
        double lx[2] = {bx + 8, bx + 38}, ly[2] = {y, y};
        if (cv->svg) { /* the legend's sample line is not a curve: a plain line */
            fprintf(cv->svg, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke-width=\"2\"%s", lx[0], y, lx[1], y,
                    cs[k].dashed ? " stroke-dasharray=\"7,4\"" : "");
            svg_color(cv->svg, "stroke", cs[k].color);
            fputs("/>\n", cv->svg);
        } else {
            cairo_set_source_rgb(cv->cr, cs[k].color.r, cs[k].color.g, cs[k].color.b);
            cairo_set_line_width(cv->cr, 2);
            const double dash[2] = {7, 4};
            cairo_set_dash(cv->cr, dash, cs[k].dashed ? 2 : 0, 0);
            cairo_move_to(cv->cr, lx[0], ly[0]);
            cairo_line_to(cv->cr, lx[1], ly[1]);
            cairo_stroke(cv->cr);
            cairo_set_dash(cv->cr, NULL, 0, 0);
        }
        cv_text(cv, bx + 46, y + 4, cs[k].name, 12, 0, false, false, GREY);
    }
#undef PX
#undef PY
}

/* Makes the temporary file of @p path: path.tmp.XXXXXX (mkstemp), the name
 * em_run_dir_remove_stale_tmp removes when a killed run left one. Returns an
 * open FILE (for the SVG) or, with @p keep_open false, NULL after closing it;
 * -1 in *bad on failure. */
static FILE *make_tmp(const char *path, char *tmp, size_t ntmp, bool keep_open, int *bad, char *err, size_t nerr)
{
    *bad = 0;
    snprintf(tmp, ntmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, nerr, "cannot create a temporary file for %s: %s", path, strerror(errno));
        *bad = -1;
        return NULL;
    }
    mode_t um = umask(0);
    umask(um);
    fchmod(fd, 0666 & ~um); /* the mode a plain fopen would give, not mkstemp's 0600 */
    if (!keep_open) {
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        snprintf(err, nerr, "cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        remove(tmp);
        *bad = -1;
    }
    return f;
}

/* Ends an atomic write: renames @p tmp to @p path when @p ok, else (or when
 * the rename fails) removes @p tmp and reports @p why. */
static int finish_tmp(const char *tmp, const char *path, bool ok, const char *why, char *err, size_t nerr)
{
    if (!ok) snprintf(err, nerr, "cannot write %s: %s", tmp, why);
    else if (rename(tmp, path) != 0) snprintf(err, nerr, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    else return 0;
    remove(tmp);
    return EM_TOOL_PLOT_WRITE;
}

/* Writes @p path atomically (path.tmp.XXXXXX, then rename). */
static int write_png(const char *path, const curve *cs, int nc, const char *title, const char *xlabel, const char *ylabel, bool legend_bottom,
                     bool unit_range, char *err, size_t nerr)
{
    char tmp[4200];
    int bad;
    make_tmp(path, tmp, sizeof tmp, false, &bad, err, nerr);
    if (bad) return EM_TOOL_PLOT_WRITE;
    cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, PLOT_W, PLOT_H);
    cairo_t *cr = cairo_create(s);
    canvas cv = {.cr = cr};
    draw_figure(&cv, cs, nc, title, xlabel, ylabel, legend_bottom, unit_range);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png(s, tmp);
    cairo_surface_destroy(s);
    return finish_tmp(tmp, path, st == CAIRO_STATUS_SUCCESS,
                      st == CAIRO_STATUS_WRITE_ERROR ? strerror(errno) : cairo_status_to_string(st), err, nerr);
}

static int write_svg(const char *path, const curve *cs, int nc, const char *title, const char *xlabel, const char *ylabel, bool legend_bottom,
                     bool unit_range, char *err, size_t nerr)
{
    char tmp[4200];
    int bad;
    FILE *f = make_tmp(path, tmp, sizeof tmp, true, &bad, err, nerr);
    if (bad) return EM_TOOL_PLOT_WRITE;
    cairo_surface_t *s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1); /* text measurements */
    cairo_t *cr = cairo_create(s);
    canvas cv = {.cr = cr, .svg = f};
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n<title>",
            PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    svg_escape(f, title);
    fputs("</title>\n", f);
    draw_figure(&cv, cs, nc, title, xlabel, ylabel, legend_bottom, unit_range);
    fputs("</svg>\n", f);
    cairo_destroy(cr);
    cairo_surface_destroy(s);
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    return finish_tmp(tmp, path, ok, strerror(errno), err, nerr);
}

/* mkdir -p of @p prefix when it is a folder (ends in '/'): 0, or -1 with the reason in @p err. */
static int make_prefix_dir(const char *prefix, char *err, size_t nerr)
{
    const char *slash = strrchr(prefix, '/');
    if (!slash || slash == prefix || slash[1]) return 0;
    char path[4096];
    if ((size_t)(slash - prefix) >= sizeof path) {
        snprintf(err, nerr, "--out: the folder name is too long");
        return -1;
    }
    memcpy(path, prefix, (size_t)(slash - prefix));
    path[slash - prefix] = 0;
    for (char *p = path + 1;; p++) {
        if (*p && *p != '/') continue;
        const char c = *p;
        *p = 0;
        struct stat st;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            snprintf(err, nerr, "cannot create the folder %s: %s", path, strerror(errno));
            return -1;
        }
        if (!c && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) {
            snprintf(err, nerr, "cannot write into %s: it is not a folder", path);
            return -1;
        }
        if (!c) return 0;
        *p = c;
    }
}

static bool any_finite(const double *v, int n)
{
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) return true;
    return false;
}

#endif /* EMBER_HAVE_CAIRO */

bool em_tool_plot_available(void)
{
#ifdef EMBER_HAVE_CAIRO
    return true;
#else
    return false;
#endif
}

/* "runs/a/metrics.csv" -> "runs/a"; "metrics.csv" -> "." */
static void run_name(const char *csv, char *out, size_t n)
{
    const char *slash = strrchr(csv, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == csv) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - csv), csv);
}

int em_tool_plot_metrics(const char *const *metrics_csv, const char *const *labels, int nruns, const char *out_prefix,
                         const char *title, char *err, size_t nerr)
{
    if (err && nerr) err[0] = 0;
    if (nruns < 1 || nruns > EM_TOOL_PLOT_MAX_RUNS || !metrics_csv || !out_prefix) {
        snprintf(err, nerr, "plot: between 1 and %d runs, got %d", EM_TOOL_PLOT_MAX_RUNS, nruns);
        return EM_TOOL_PLOT_BAD_METRICS;
    }
    /* read everything first: a bad file writes nothing */
    em_tool_metrics m[EM_TOOL_PLOT_MAX_RUNS];
    memset(m, 0, sizeof m);
    int rc = 0;
    for (int r = 0; r < nruns && rc == 0; r++)
        if (em_tool_read_metrics(metrics_csv[r], &m[r], err, nerr) != 0) rc = EM_TOOL_PLOT_BAD_METRICS;
#ifdef EMBER_HAVE_CAIRO
    char names[EM_TOOL_PLOT_MAX_RUNS][128];
    for (int r = 0; r < nruns; r++) {
        if (labels && labels[r]) snprintf(names[r], sizeof names[r], "%s", labels[r]);
        else run_name(metrics_csv[r], names[r], sizeof names[r]);
    }
    char ttl[256];
    if (title) snprintf(ttl, sizeof ttl, "%s", title);
    else if (nruns == 1) snprintf(ttl, sizeof ttl, "%s", names[0]);
    else {
        int k = snprintf(ttl, sizeof ttl, "%s", names[0]);
        for (int r = 1; r < nruns && k < (int)sizeof ttl; r++) k += snprintf(ttl + k, sizeof ttl - (size_t)k, " vs %s", names[r]);
        if (k >= (int)sizeof ttl) snprintf(ttl, sizeof ttl, "%d runs", nruns);
    }
    /* a folder prefix ("runs/cmp/") that does not exist yet is created, once every file has been read */
    if (rc == 0 && make_prefix_dir(out_prefix, err, nerr) != 0) rc = EM_TOOL_PLOT_WRITE;
    /* an iteration-mode metrics.csv (ember train --model gpt) has losses only:
     * one figure against the iteration */
    for (int r = 1; r < nruns && rc == 0; r++)
        if (m[r].iterations != m[0].iterations) {
            snprintf(err, nerr, "%s counts %s and %s counts %s: runs of both kinds cannot share a plot", metrics_csv[0],
                     m[0].iterations ? "iterations" : "epochs", metrics_csv[r], m[r].iterations ? "iterations" : "epochs");
            rc = EM_TOOL_PLOT_BAD_METRICS;
        }
    const char *xlabel = nruns > 0 && m[0].iterations ? "iteration" : "epoch";
    const int nfig = nruns > 0 && m[0].iterations ? 1 : 2;
    for (int fig = 0; fig < nfig && rc == 0; fig++) {
        const bool acc = fig == 1;
        curve cs[2 * EM_TOOL_PLOT_MAX_RUNS];
        int nc = 0;
        for (int r = 0; r < nruns; r++) {
            const double *tr = acc ? m[r].train_accuracy : m[r].train_loss, *va = acc ? m[r].val_accuracy : m[r].val_loss;
            for (int part = 0; part < 2; part++) {
                const double *y = part ? va : tr;
                if (!any_finite(y, m[r].n)) continue; /* e.g. no validation set */
                curve *c = &cs[nc++];
                c->xonly = false;
                c->x = m[r].epoch;
                c->y = y;
                c->n = m[r].n;
                c->color = PALETTE[(nruns == 1 ? part : r) % 10]; /* one run: train / validation colours; several: a colour per run */
                c->dashed = nruns > 1 && part == 0;                /* several runs: train dashed, validation solid */
                if (nruns == 1) snprintf(c->name, sizeof c->name, "%s", part ? "validation" : "train");
                else snprintf(c->name, sizeof c->name, "%.127s %s", names[r], part ? "validation" : "train");
            }
        }
        for (int r = 0; nc == 0 && r < nruns; r++) /* nothing finite: the runs' epochs still make the frame */
            cs[r] = (curve){.x = m[r].epoch, .y = NULL, .n = m[r].n, .xonly = true};
        if (nc == 0) nc = nruns;
        char t[300], path[4096];
        snprintf(t, sizeof t, "%s: %s", ttl, acc ? "accuracy" : "loss");
        const char *stem = acc ? "accuracy" : "loss";
        snprintf(path, sizeof path, "%s%s.png", out_prefix, stem);
        rc = write_png(path, cs, nc, t, xlabel, acc ? "accuracy" : "loss", acc, acc, err, nerr);
        if (rc == 0) {
            snprintf(path, sizeof path, "%s%s.svg", out_prefix, stem);
            rc = write_svg(path, cs, nc, t, xlabel, acc ? "accuracy" : "loss", acc, acc, err, nerr);
        }
    }
#else
    (void)labels;
    (void)title;
    (void)run_name;
    if (rc == 0) {
        snprintf(err, nerr, "plotting is unavailable: this ember was built without cairo (install libcairo2-dev and rebuild)");
        rc = EM_TOOL_PLOT_UNAVAILABLE;
    }
#endif
    for (int r = 0; r < nruns; r++) em_tool_metrics_free(&m[r]);
    return rc;
}

void em_tool_plot_run_dir(const char *out, bool *reported)
{
    char csv[4096], prefix[4096], err[1024];
    snprintf(csv, sizeof csv, "%s/metrics.csv", out);
    snprintf(prefix, sizeof prefix, "%s/", out);
    const char *paths[1] = {csv};
    if (em_tool_plot_metrics(paths, NULL, 1, prefix, NULL, err, sizeof err) != 0 && !*reported) {
        fprintf(stderr, "ember train: plots not written: %s\n", err);
        *reported = true;
    }
}

/* ---- ember plot ------------------------------------------------------------- */

static void plot_help(void)
{
    printf("usage: ember plot RUN_DIR [RUN_DIR...] [--out PREFIX] [--title TEXT]\n\n"
           "Draws the training curves of runs written by 'ember train' (their metrics.csv):\n"
           "loss.png and accuracy.png (and loss.svg, accuracy.svg), train and validation\n"
           "against the epoch. 'ember train' already writes them next to metrics.csv after\n"
           "every epoch; this redraws them, or overlays several runs (one colour per run,\n"
           "train dashed, validation solid). A RUN_DIR may also be a metrics.csv file.\n"
           "A language-model run (ember train --model gpt) has losses only: loss.png and\n"
           "loss.svg against the iteration; it cannot share a plot with an epoch run.\n\n"
           "  --out PREFIX   where the images go: a folder (ending in / or existing) or a\n"
           "                 file-name prefix (--out cmp- writes cmp-loss.png, ...);\n"
           "                 default: RUN_DIR/ for one run, plot- (in the current folder)\n"
           "                 for several\n"
           "  --title TEXT   figure title (default: the run folders)\n\n"
           "Exit status: 0 written, 1 a metrics.csv is unreadable or malformed (nothing is\n"
           "written), an image cannot be written or this ember was built without cairo,\n"
           "2 usage error.\n");
}

/* The first @p len characters of @p dir as a folder prefix with one trailing '/' ("out//" -> "out/",
 * "/" stays "/"); len 0 gives "" (the current folder). */
static void dir_prefix(const char *dir, size_t len, char *out, size_t n)
{
    while (len > 1 && dir[len - 1] == '/' && dir[len - 2] == '/') len--;
    if (len > 0 && dir[len - 1] != '/') snprintf(out, n, "%.*s/", (int)len, dir);
    else snprintf(out, n, "%.*s", (int)len, dir);
}

int em_tool_plot(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"title", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *out = NULL, *title = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 't': title = optarg; break;
        case 'h': plot_help(); return 0;
        default: return em_tool_bad_option("plot", c, argc, argv);
        }
    }
    int nruns = argc - optind;
    if (nruns < 1) {
        fprintf(stderr, "ember plot: no run given (usage: ember plot RUN_DIR [RUN_DIR...] [--out PREFIX]; see 'ember plot --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    if (nruns > EM_TOOL_PLOT_MAX_RUNS) {
        fprintf(stderr, "ember plot: %d runs given, at most %d can be overlaid (see 'ember plot --help')\n", nruns,
                EM_TOOL_PLOT_MAX_RUNS);
        return EM_TOOL_EXIT_USAGE;
    }
    if (out && !*out) {
        fprintf(stderr, "ember plot: --out is empty (see 'ember plot --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    static char csv[EM_TOOL_PLOT_MAX_RUNS][4096], label[EM_TOOL_PLOT_MAX_RUNS][4096];
    const char *paths[EM_TOOL_PLOT_MAX_RUNS], *labels[EM_TOOL_PLOT_MAX_RUNS];
    for (int r = 0; r < nruns; r++) {
        const char *arg = argv[optind + r];
        size_t len = strlen(arg);
        while (len > 1 && arg[len - 1] == '/') len--;
        struct stat st;
        if (stat(arg, &st) == 0 && S_ISREG(st.st_mode)) { /* a metrics.csv itself */
            snprintf(csv[r], sizeof csv[r], "%s", arg);
            label[r][0] = 0;
        } else {
            snprintf(csv[r], sizeof csv[r], "%.*s/metrics.csv", (int)len, arg);
            snprintf(label[r], sizeof label[r], "%.*s", (int)len, arg);
        }
        paths[r] = csv[r];
        labels[r] = label[r][0] ? label[r] : NULL;
    }
    char prefix[4096];
    if (!out && nruns == 1) { /* the run's own folder */
        const char *slash = strrchr(csv[0], '/');
        dir_prefix(csv[0], slash ? (size_t)(slash - csv[0] + 1) : 0, prefix, sizeof prefix);
    } else if (!out) {
        snprintf(prefix, sizeof prefix, "plot-");
    } else {
        struct stat st;
        bool dir = out[strlen(out) - 1] == '/' || (stat(out, &st) == 0 && S_ISDIR(st.st_mode));
        if (dir) dir_prefix(out, strlen(out), prefix, sizeof prefix);
        else snprintf(prefix, sizeof prefix, "%s", out);
    }
    char err[1024];
    int rc = em_tool_plot_metrics(paths, labels, nruns, prefix, title, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "ember plot: %s\n", err);
        return 1;
    }
    em_tool_metrics m0; /* read fine above: which figures were drawn */
    const bool iters = em_tool_read_metrics(paths[0], &m0, err, sizeof err) == 0 && m0.iterations;
    em_tool_metrics_free(&m0);
    if (iters)
        printf("wrote %sloss.png, %sloss.svg\n", prefix, prefix);
    else
        printf("wrote %sloss.png, %saccuracy.png, %sloss.svg, %saccuracy.svg\n", prefix, prefix, prefix, prefix);
    return 0;
}
