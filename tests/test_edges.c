/* Op semantics at the edges, against PyTorch (issue #20, item 10).
 *
 * tests/fixtures/edge_fixtures.txt (written by gen_edge_fixtures.py with
 * Debian's torch; the format is described there) holds one case per line:
 * an op of the public API, its parameters and inputs (empty tensors, +-0,
 * +-inf, NaN, subnormals, integer extremes, division by zero, broadcasting
 * corners, every dtype) and PyTorch's result: values (bit-exact, or within
 * a few ulps for transcendental functions; NaN, inf and the sign of zero
 * always exact), the result dtype and shape, or "error". grad.<op> cases
 * compare d sum(op(x)) / dx. (With a ulps tolerance a zero matches a
 * zero of either sign.)
 *
 * Every case runs through the public API on the CPU and on every other
 * device of the process (each CUDA and OpenCL device, as test_consistency
 * finds them). A case passes when Ember gives the same dtype, shape and
 * values, or fails (NULL from the op, or an error from em_to_host: the
 * sticky kernel error) where PyTorch raises. Cases marked "D key" are
 * deliberate differences (the expectation is Ember's defined behaviour);
 * their reasons are printed. Every mismatch is listed, then the test fails.
 * Every element-wise op of tasks/ops.def must have a case. */
#include "optable.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 8
#define MAX_OUT 16

static const em_dtype DTS[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
static const char *DTN[] = {"f32", "f64", "i32", "i64", "u8", "bool"};

typedef struct et {
    em_dtype dt;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t n;
    double *f;  /* float values */
    int64_t *i; /* integer values */
} et;

typedef struct expect {
    bool error;
    int nout;
    et out[MAX_OUT];
} expect;

typedef struct ecase {
    char tag[96];
    char op[48];
    int ulps;
    int np;
    double p[24];
    int nin;
    et in[MAX_IN];
    expect exp;
    bool has_alt;
    expect alt;
    char deliberate[32];
    int line;
} ecase;

/* ---- parsing ------------------------------------------------------------ */

static char *tok(char **s)
{
    while (**s == ' ') (*s)++;
    if (!**s || **s == '#' || **s == '\n') return NULL;
    char *b = *s;
    while (**s && **s != ' ' && **s != '\n') (*s)++;
    if (**s) *(*s)++ = 0;
    return b;
}

static bool need(char **s, char **t)
{
    *t = tok(s);
    return *t != NULL;
}

static bool parse_tensor(char **s, et *t)
{
    char *w;
    if (!need(s, &w)) return false;
    int d = -1;
    for (int k = 0; k < 6; k++)
        if (!strcmp(w, DTN[k])) d = k;
    if (d < 0) return false;
    t->dt = DTS[d];
    if (!need(s, &w)) return false;
    t->ndim = atoi(w);
    t->n = 1;
    for (int j = 0; j < t->ndim; j++) {
        if (!need(s, &w)) return false;
        t->shape[j] = strtoll(w, NULL, 10);
        t->n *= t->shape[j];
    }
    bool fl = t->dt == EM_F32 || t->dt == EM_F64;
    t->f = fl ? calloc((size_t)t->n + 1, sizeof(double)) : NULL;
    t->i = fl ? NULL : calloc((size_t)t->n + 1, sizeof(int64_t));
    for (int64_t j = 0; j < t->n; j++) {
        if (!need(s, &w)) return false;
        if (fl) t->f[j] = strtod(w, NULL);
        else t->i[j] = strtoll(w, NULL, 10);
    }
    return true;
}

static bool parse_expect(char **s, expect *e)
{
    char *w;
    if (!need(s, &w)) return false;
    if (!strcmp(w, "E")) {
        e->error = true;
        return true;
    }
    if (strcmp(w, "V") || !need(s, &w)) return false;
    e->nout = atoi(w);
    if (e->nout > MAX_OUT) return false;
    for (int k = 0; k < e->nout; k++)
        if (!parse_tensor(s, &e->out[k])) return false;
    return true;
}

static void free_tensor(et *t)
{
    free(t->f);
    free(t->i);
}

static void free_case(ecase *c)
{
    for (int k = 0; k < c->nin; k++) free_tensor(&c->in[k]);
    for (int k = 0; k < c->exp.nout; k++) free_tensor(&c->exp.out[k]);
    for (int k = 0; k < c->alt.nout; k++) free_tensor(&c->alt.out[k]);
}

typedef struct deliberate {
    char key[32];
    char text[600];
    int count;
} deliberate;

static deliberate g_del[48];
static int g_ndel;

static bool parse_line(char *s, ecase *c)
{
    char *w;
    memset(c, 0, sizeof *c);
    if (!need(&s, &w)) return false;
    snprintf(c->tag, sizeof c->tag, "%s", w);
    if (!need(&s, &w)) return false;
    snprintf(c->op, sizeof c->op, "%s", w);
    if (!need(&s, &w)) return false;
    c->ulps = atoi(w);
    if (!need(&s, &w)) return false;
    c->np = atoi(w);
    if (c->np > 24) return false;
    for (int k = 0; k < c->np; k++) {
        if (!need(&s, &w)) return false;
        c->p[k] = strtod(w, NULL);
    }
    if (!need(&s, &w)) return false;
    c->nin = atoi(w);
    if (c->nin > MAX_IN) return false;
    for (int k = 0; k < c->nin; k++)
        if (!parse_tensor(&s, &c->in[k])) return false;
    if (!parse_expect(&s, &c->exp)) return false;
    while ((w = tok(&s))) {
        if (!strcmp(w, "D")) {
            if (!need(&s, &w)) return false;
            snprintf(c->deliberate, sizeof c->deliberate, "%s", w);
        } else if (!strcmp(w, "ALT")) {
            c->has_alt = true;
            if (!parse_expect(&s, &c->alt)) return false;
        } else
            return false;
    }
    return true;
}

/* ---- running a case ------------------------------------------------------ */

static em_tensor *make(const et *t)
{
    size_t es = em_dtype_size(t->dt);
    char *raw = calloc((size_t)t->n + 1, es);
    for (int64_t j = 0; j < t->n; j++) {
        char *p = raw + (size_t)j * es;
        switch (t->dt) {
        case EM_F32: *(float *)p = (float)t->f[j]; break;
        case EM_F64: *(double *)p = t->f[j]; break;
        case EM_I32: *(int32_t *)p = (int32_t)t->i[j]; break;
        case EM_I64: *(int64_t *)p = t->i[j]; break;
        default: *(uint8_t *)p = (uint8_t)t->i[j]; break;
        }
    }
    em_tensor *r = em_from_host(raw, t->shape, t->ndim, t->dt);
    free(raw);
    return r;
}

/* the EW1 / EWS / EW2 lines by their functions: em_test_ew*_fns (optable.h) */
/* the EWP lines: their own front ends, with the parameters as the fixture gives them */
static const char *EWP_NAMES[] = {
#define EWP(E, nm, fl, fx, ix, bw) #nm,
#define EW1(E, nm, fl, fx, ix, bw)
#define EWS(E, nm, fl, fx, ix, bw)
#define EW2(E, nm, fl, fx, ix, bw)
#define OP(E, nm, nin, nout, fl, fam, bw)
#include "tasks/ops.def"
};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int red_dims(const ecase *c, int at, int *dims)
{
    int n = (int)c->p[at];
    for (int k = 0; k < n && k < 8; k++) dims[k] = (int)c->p[at + 1 + k];
    return n;
}

/* Calls em_<op> on the case's inputs; the results go to out (count in *nout).
 * Returns false when the op is unknown to this test. */
static bool call(const char *op, const ecase *c, em_tensor **in, em_tensor **out, int *nout)
{
    const double *p = c->p;
    *nout = 1;
    out[0] = NULL;
    int dims[8];
    for (int k = 0; k < NELEM(em_test_ew1_fns); k++)
        if (!strcmp(op, em_test_ew1_fns[k].name)) return out[0] = em_test_ew1_fns[k].f(in[0]), true;
    for (int k = 0; k < NELEM(em_test_ews_fns); k++)
        if (!strcmp(op, em_test_ews_fns[k].name)) return out[0] = em_test_ews_fns[k].f(in[0], p[0]), true;
    for (int k = 0; k < NELEM(em_test_ew2_fns); k++)
        if (!strcmp(op, em_test_ew2_fns[k].name)) return out[0] = em_test_ew2_fns[k].f(in[0], in[1]), true;
    if (!strcmp(op, "clamp")) out[0] = em_clamp(in[0], p[0], p[1]);
    else if (!strcmp(op, "pow_scalar")) out[0] = em_pow_scalar(in[0], p[0]);
    else if (!strcmp(op, "leaky_relu")) out[0] = em_leaky_relu(in[0], p[0]);
    else if (!strcmp(op, "elu")) out[0] = em_elu(in[0], p[0]);
    else if (!strcmp(op, "celu")) out[0] = em_celu(in[0], p[0]);
    else if (!strcmp(op, "where")) out[0] = em_where(in[0], in[1], in[2]);
    else if (!strcmp(op, "masked_fill")) out[0] = em_masked_fill(in[0], in[1], p[0]);
    else if (!strcmp(op, "sum") || !strcmp(op, "mean") || !strcmp(op, "prod") || !strcmp(op, "max") ||
             !strcmp(op, "min") || !strcmp(op, "logsumexp") || !strcmp(op, "any") || !strcmp(op, "all")) {
        em_tensor *(*f)(const em_tensor *, const int *, int, bool) =
            !strcmp(op, "sum") ? em_sum : !strcmp(op, "mean") ? em_mean : !strcmp(op, "prod") ? em_prod
            : !strcmp(op, "max") ? em_max : !strcmp(op, "min") ? em_min : !strcmp(op, "logsumexp") ? em_logsumexp
            : !strcmp(op, "any") ? em_any : em_all;
        int n = red_dims(c, 1, dims);
        out[0] = f(in[0], dims, n, p[0] != 0);
    } else if (!strcmp(op, "var") || !strcmp(op, "std")) {
        int n = red_dims(c, 2, dims);
        out[0] = (!strcmp(op, "var") ? em_var : em_std)(in[0], dims, n, p[0], p[1] != 0);
    } else if (!strcmp(op, "argmax")) out[0] = em_argmax(in[0], (int)p[0], p[1] != 0);
    else if (!strcmp(op, "argmin")) out[0] = em_argmin(in[0], (int)p[0], p[1] != 0);
    else if (!strcmp(op, "sum_all")) out[0] = em_sum_all(in[0]);
    else if (!strcmp(op, "mean_all")) out[0] = em_mean_all(in[0]);
    else if (!strcmp(op, "softmax")) out[0] = em_softmax(in[0], (int)p[0]);
    else if (!strcmp(op, "log_softmax")) out[0] = em_log_softmax(in[0], (int)p[0]);
    else if (!strcmp(op, "matmul")) out[0] = em_matmul(in[0], in[1]);
    else if (!strcmp(op, "reshape") || !strcmp(op, "expand")) {
        int64_t sh[8];
        int n = (int)p[0];
        for (int k = 0; k < n; k++) sh[k] = (int64_t)p[1 + k];
        out[0] = (!strcmp(op, "reshape") ? em_reshape : em_expand)(in[0], sh, n);
    } else if (!strcmp(op, "squeeze")) out[0] = em_squeeze(in[0], (int)p[0]);
    else if (!strcmp(op, "unsqueeze")) out[0] = em_unsqueeze(in[0], (int)p[0]);
    else if (!strcmp(op, "transpose")) out[0] = em_transpose(in[0], (int)p[0], (int)p[1]);
    else if (!strcmp(op, "permute")) {
        int n = red_dims(c, 0, dims);
        out[0] = em_permute(in[0], dims, n);
    } else if (!strcmp(op, "flatten")) out[0] = em_flatten(in[0], (int)p[0], (int)p[1]);
    else if (!strcmp(op, "contiguous")) out[0] = em_contiguous(in[0]);
    else if (!strcmp(op, "slice")) out[0] = em_slice(in[0], (int)p[0], (int64_t)p[1], (int64_t)p[2], (int64_t)p[3]);
    else if (!strcmp(op, "narrow")) out[0] = em_narrow(in[0], (int)p[0], (int64_t)p[1], (int64_t)p[2]);
    else if (!strcmp(op, "cat")) out[0] = em_cat(in, c->nin, (int)p[0]);
    else if (!strcmp(op, "stack")) out[0] = em_stack(in, c->nin, (int)p[0]);
    else if (!strcmp(op, "split") || !strcmp(op, "chunk")) {
        int n = !strcmp(op, "split") ? em_split(in[0], (int64_t)p[0], (int)p[1], out, MAX_OUT)
                                     : em_chunk(in[0], (int)p[0], (int)p[1], out, MAX_OUT);
        *nout = n < 0 ? 1 : n;
        if (n < 0) out[0] = NULL;
    } else if (!strcmp(op, "gather")) out[0] = em_gather(in[0], (int)p[0], in[1]);
    else if (!strcmp(op, "scatter")) out[0] = em_scatter(in[0], (int)p[0], in[1], in[2]);
    else if (!strcmp(op, "scatter_add")) out[0] = em_scatter_add(in[0], (int)p[0], in[1], in[2]);
    else if (!strcmp(op, "index_select")) out[0] = em_index_select(in[0], (int)p[0], in[1]);
    else if (!strcmp(op, "one_hot")) out[0] = em_one_hot(in[0], (int64_t)p[0]);
    else if (!strcmp(op, "cast")) out[0] = em_cast(in[0], DTS[(int)p[0]]);
    else if (!strcmp(op, "pad")) {
        int64_t pads[8];
        int n = (int)p[0];
        for (int k = 0; k < n; k++) pads[k] = (int64_t)p[1 + k];
        out[0] = em_pad(in[0], pads, n, p[1 + n]);
    } else if (!strcmp(op, "conv2d")) out[0] = em_conv2d(in[0], in[1], c->nin > 2 ? in[2] : NULL, NULL);
    else if (!strcmp(op, "max_pool2d") || !strcmp(op, "avg_pool2d")) {
        em_pool_opts o = em_pool_opts_default((int64_t)p[0], (int64_t)p[0]);
        o.stride[0] = o.stride[1] = (int64_t)p[1];
        out[0] = !strcmp(op, "max_pool2d") ? em_max_pool2d(in[0], &o, NULL) : em_avg_pool2d(in[0], &o);
    } else if (!strcmp(op, "adaptive_avg_pool2d")) out[0] = em_adaptive_avg_pool2d(in[0], (int64_t)p[0], (int64_t)p[1]);
    else return false;
    return true;
}

/* ---- comparing ------------------------------------------------------------ */

/* Position of a float on a line where adjacent floats are 1 apart (-0 just
 * below +0). */
static int64_t ordered(double v, em_dtype dt)
{
    if (dt == EM_F32) {
        float f = (float)v;
        int32_t b;
        memcpy(&b, &f, 4);
        return b >= 0 ? (int64_t)b : -(int64_t)(b & 0x7fffffff) - 1;
    }
    int64_t b;
    memcpy(&b, &v, 8);
    return b >= 0 ? b : -(b & INT64_MAX) - 1;
}

static void fmtv(char *buf, size_t n, const et *t, int64_t j)
{
    if (t->f) snprintf(buf, n, "%.9g%s", t->f[j], t->f[j] == 0 && signbit(t->f[j]) ? " (-0)" : "");
    else snprintf(buf, n, "%lld", (long long)t->i[j]);
}

/* Reads r into got (dtype/shape from r) and compares it with want; writes why on a mismatch. */
static bool compare(const em_tensor *r, const et *want, int ulps, char *why, size_t n, em_status *st)
{
    char a[200], b[200];
    *st = EM_OK;
    em_dtype dt = em_tensor_dtype(r);
    if (dt != want->dt) {
        snprintf(why, n, "dtype %s, expected %s", em_dtype_name(dt), em_dtype_name(want->dt));
        return false;
    }
    if (em_tensor_ndim(r) != want->ndim ||
        (want->ndim && memcmp(em_tensor_shape(r), want->shape, sizeof(int64_t) * (size_t)want->ndim))) {
        snprintf(why, n, "shape %s, expected %s", em_shape_str(em_tensor_shape(r), em_tensor_ndim(r), a, sizeof a),
                 em_shape_str(want->shape, want->ndim, b, sizeof b));
        return false;
    }
    size_t es = em_dtype_size(dt);
    int64_t cnt = want->n;
    char *raw = calloc((size_t)cnt + 1, es);
    *st = em_to_host(r, raw, (size_t)cnt * es);
    if (*st != EM_OK) {
        snprintf(why, n, "error %s", em_last_error());
        free(raw);
        return false;
    }
    int bad = 0;
    int64_t first = -1;
    for (int64_t j = 0; j < cnt; j++) {
        const char *p = raw + (size_t)j * es;
        bool ok;
        if (want->f) {
            double g = dt == EM_F32 ? *(const float *)p : *(const double *)p, w = want->f[j];
            if (isnan(w) || isnan(g)) ok = isnan(w) && isnan(g);
            else if (isinf(w) || isinf(g)) ok = g == w;
            else if (w == 0 && g == 0) ok = ulps > 0 || signbit(g) == signbit(w); /* the sign of zero: exact cases only */
            else ok = llabs(ordered(g, dt) - ordered(w, dt)) <= ulps;
        } else {
            int64_t g = dt == EM_I32 ? *(const int32_t *)p : dt == EM_I64 ? *(const int64_t *)p : *(const uint8_t *)p;
            ok = g == want->i[j];
        }
        if (!ok && bad++ == 0) first = j;
    }
    if (bad) {
        const char *p = raw + (size_t)first * es;
        char gs[64], ws[64];
        if (want->f) {
            double g = dt == EM_F32 ? *(const float *)p : *(const double *)p;
            snprintf(gs, sizeof gs, "%.9g%s", g, g == 0 && signbit(g) ? " (-0)" : "");
        } else
            snprintf(gs, sizeof gs, "%lld",
                     (long long)(dt == EM_I32 ? *(const int32_t *)p : dt == EM_I64 ? *(const int64_t *)p : *(const uint8_t *)p));
        fmtv(ws, sizeof ws, want, first);
        snprintf(why, n, "%d of %lld values differ; element %lld: got %s, expected %s", bad, (long long)cnt, (long long)first, gs, ws);
    }
    free(raw);
    return bad == 0;
}

static void input_desc(const ecase *c, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < c->nin && k < n; i++) {
        char s[120];
        k += (size_t)snprintf(buf + k, n - k, "%s%s%s", i ? ", " : "", em_dtype_name(c->in[i].dt),
                              em_shape_str(c->in[i].shape, c->in[i].ndim, s, sizeof s));
        for (int64_t j = 0; j < c->in[i].n && j < 4 && k < n; j++) {
            fmtv(s, sizeof s, &c->in[i], j);
            k += (size_t)snprintf(buf + k, n - k, "%s%s", j ? " " : " {", s);
        }
        if (c->in[i].n && k < n) k += (size_t)snprintf(buf + k, n - k, "%s}", c->in[i].n > 4 ? " ..." : "");
    }
}

/* Runs one case; true when Ember agrees with the expectation. */
/* The tolerance of a case on a device: where a device's math library
 * promises less than the CPU reference (glibc's pow is correctly rounded on
 * these inputs), its documented bound: OpenCL 1.2 §7.4 allows pow 16 ulp
 * (NVIDIA's OpenCL uses it: pow(10, 2) in f32 is 99.9999924), CUDA's pow is
 * within 2 ulp (CUDA Math API, float and double). Nothing else is loosened. */
static int device_ulps(const ecase *c, em_device_kind kind)
{
    const char *op = !strncmp(c->op, "grad.", 5) ? c->op + 5 : c->op;
    if (kind == EM_DEVICE_CPU || (strcmp(op, "pow") && strcmp(op, "pow_scalar"))) return c->ulps;
    const int bound = kind == EM_DEVICE_OPENCL ? 16 : 2;
    return c->ulps > bound ? c->ulps : bound;
}

static bool run_case(const ecase *c, const expect *e, em_device_kind kind, char *why, size_t n)
{
    bool grad = !strncmp(c->op, "grad.", 5);
    const char *op = grad ? c->op + 5 : c->op;
    em_scope_begin();
    em_tensor *in[MAX_IN] = {0}, *out[MAX_OUT] = {0};
    bool ok = true;
    for (int k = 0; k < c->nin; k++) {
        in[k] = make(&c->in[k]);
        if (!in[k]) {
            snprintf(why, n, "cannot make input %d: %s", k, em_last_error());
            em_scope_end();
            return false;
        }
        if (grad && (c->in[k].dt == EM_F32 || c->in[k].dt == EM_F64)) em_set_requires_grad(in[k], true);
    }
    int nout = 0;
    if (!call(op, c, in, out, &nout)) {
        snprintf(why, n, "op %s unknown to tests/test_edges.c", op);
        em_scope_end();
        return false;
    }
    em_grads *g = NULL;
    if (grad && out[0]) {
        em_tensor *loss = em_sum_all(out[0]);
        g = loss ? em_backward(loss) : NULL;
        nout = 0;
        if (g)
            for (int k = 0; k < c->nin; k++)
                if (c->in[k].dt == EM_F32 || c->in[k].dt == EM_F64) {
                    em_tensor *gk = em_grad(g, in[k]);
                    out[nout++] = gk ? gk : em_zeros_like(in[k]); /* gk is borrowed until em_grads_free */
                }
        if (!g) out[0] = NULL;
    }
    bool failed = !out[0] && nout <= 1;
    if (e->error) {
        if (!failed) {
            /* an error may also come from the kernel, on the next read */
            em_status st = EM_OK;
            for (int k = 0; k < nout && st == EM_OK; k++) {
                size_t bytes = (size_t)em_tensor_numel(out[k]) * em_dtype_size(em_tensor_dtype(out[k]));
                void *tmp = malloc(bytes + 8);
                st = em_to_host(out[k], tmp, bytes);
                free(tmp);
            }
            if (st == EM_OK) {
                char s[200];
                snprintf(why, n, "no error (PyTorch raises); result %s %s", em_dtype_name(em_tensor_dtype(out[0])),
                         em_shape_str(em_tensor_shape(out[0]), em_tensor_ndim(out[0]), s, sizeof s));
                ok = false;
            }
        }
    } else if (failed) {
        snprintf(why, n, "error where PyTorch gives a result: %s", em_last_error());
        ok = false;
    } else if (nout != e->nout) {
        snprintf(why, n, "%d results, expected %d", nout, e->nout);
        ok = false;
    } else
        for (int k = 0; k < nout && ok; k++) {
            em_status st;
            char w[600];
            if (!compare(out[k], &e->out[k], device_ulps(c, kind), w, sizeof w, &st)) {
                snprintf(why, n, "%s%s", nout > 1 ? "result: " : "", w);
                ok = false;
            }
        }
    if (g) em_grads_free(g);
    em_scope_end();
    return ok;
}

/* ---- the test -------------------------------------------------------------- */


static bool op_covered(const char *name, const ecase *cs, int nc)
{
    for (int k = 0; k < nc; k++)
        if (!strcmp(cs[k].op, name)) return true;
    return false;
}

static void test_edges_all(void **state)
{
    (void)state;
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/edge_fixtures.txt", dir ? dir : "tests/fixtures");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (EMBER_TEST_DATA)", path);
    size_t cap = 4096, len = 0;
    ecase *cs = malloc(cap * sizeof *cs);
    char *line = NULL;
    size_t lcap = 0;
    int lno = 0;
    while (getline(&line, &lcap, f) > 0) {
        lno++;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (!strncmp(line, "deliberate ", 11)) {
            assert_true(g_ndel < NELEM(g_del));
            char *s = line + 11, *k = tok(&s);
            snprintf(g_del[g_ndel].key, sizeof g_del[0].key, "%s", k);
            snprintf(g_del[g_ndel].text, sizeof g_del[0].text, "%s", s);
            g_del[g_ndel].text[strcspn(g_del[g_ndel].text, "\n")] = 0;
            g_ndel++;
            continue;
        }
        if (len == cap) cs = realloc(cs, (cap *= 2) * sizeof *cs);
        if (!parse_line(line, &cs[len])) fail_msg("%s:%d: cannot parse the case", path, lno);
        cs[len++].line = lno;
    }
    free(line);
    fclose(f);
    const int nc = (int)len;

    /* every element-wise op of tasks/ops.def has cases */
    int missing = 0;
    for (int k = 0; k < NELEM(em_test_ew1_fns); k++) missing += !op_covered(em_test_ew1_fns[k].name, cs, nc) && printf("edges: no case for %s\n", em_test_ew1_fns[k].name);
    for (int k = 0; k < NELEM(em_test_ews_fns); k++) missing += !op_covered(em_test_ews_fns[k].name, cs, nc) && printf("edges: no case for %s\n", em_test_ews_fns[k].name);
    for (int k = 0; k < NELEM(em_test_ew2_fns); k++) missing += !op_covered(em_test_ew2_fns[k].name, cs, nc) && printf("edges: no case for %s\n", em_test_ew2_fns[k].name);
    for (int k = 0; k < NELEM(EWP_NAMES); k++) missing += !op_covered(EWP_NAMES[k], cs, nc) && printf("edges: no case for %s\n", EWP_NAMES[k]);

    em_test_dev devs[17];
    const int nd = em_test_list_devices(devs, 17);
    const char *only = getenv("EMBER_EDGES_ONLY"); /* a tag prefix, to rerun some cases */
    const bool verbose = getenv("EMBER_EDGES_VERBOSE") != NULL;
    int nrun = 0, npass = 0, nfail = 0;
    for (int di = 0; di < nd; di++) {
        if (em_set_device(devs[di].d) != EM_OK) fail_msg("em_set_device(%s): %s", devs[di].name, em_last_error());
        int dpass = 0, dfail = 0;
        for (int k = 0; k < nc; k++) {
            const ecase *c = &cs[k];
            if (only && strncmp(c->tag, only, strlen(only))) continue;
            const expect *e = (di > 0 && c->has_alt) ? &c->alt : &c->exp;
            char why[800] = "";
            nrun++;
            if (run_case(c, e, devs[di].d.kind, why, sizeof why)) {
                npass++, dpass++;
                if (verbose) printf("ok       [%s] %s\n", devs[di].name, c->tag);
            } else {
                char ins[600];
                input_desc(c, ins, sizeof ins);
                printf("MISMATCH [%s] %s (line %d, %s(%s)): %s\n", devs[di].name, c->tag, c->line, c->op, ins, why);
                nfail++, dfail++;
            }
            if (di == 0 && c->deliberate[0])
                for (int j = 0; j < g_ndel; j++)
                    if (!strcmp(g_del[j].key, c->deliberate)) g_del[j].count++;
        }
        printf("edges: %s: %d cases, %d pass, %d mismatch\n", devs[di].name, dpass + dfail, dpass, dfail);
    }
    em_set_device(em_device_cpu());
    for (int j = 0; j < g_ndel; j++)
        printf("deliberate: %s (%d case(s)) because: %s\n", g_del[j].key, g_del[j].count, g_del[j].text);
    printf("edges: %d cases x %d device(s): %d run, %d pass, %d mismatch\n", nc, nd, nrun, npass, nfail);
    for (int k = 0; k < nc; k++) free_case(&cs[k]);
    free(cs);
    if (missing) fail_msg("%d element-wise op(s) of tasks/ops.def have no edge case", missing);
    if (nfail) fail_msg("%d case(s) differ from PyTorch (listed above)", nfail);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edges_all),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
