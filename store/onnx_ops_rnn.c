/* ONNX operators, recurrent and quantized-matmul group: RNN, GRU, LSTM
 * (a host loop over the time steps issuing Ember ops per step),
 * QLinearMatMul and MatMulInteger. Semantics from onnx/docs/Operators.md
 * (onnx 1.23); each function names the opsets whose differences it handles. */
#include "store/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- recurrent cells ---- */

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

enum { ACT_SIGMOID, ACT_TANH, ACT_RELU, ACT_SOFTSIGN, ACT_SOFTPLUS, ACT_LEAKY, ACT_HARDSIGMOID, ACT_ELU };

/* Activation names of the RNN family's `activations` attribute whose
 * parameters (when they take any) are left at their defaults. */
static int act_parse(const char *s, size_t n)
{
    static const struct { const char *name; int kind; } tab[] = {
        {"Sigmoid", ACT_SIGMOID}, {"Tanh", ACT_TANH}, {"Relu", ACT_RELU}, {"Softsign", ACT_SOFTSIGN},
        {"Softplus", ACT_SOFTPLUS}, {"LeakyRelu", ACT_LEAKY}, {"HardSigmoid", ACT_HARDSIGMOID}, {"Elu", ACT_ELU},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strlen(tab[i].name) == n && !strncasecmp(tab[i].name, s, n)) return tab[i].kind;
    return -1;
}

static em_tensor *act_apply(int k, em_tensor *x)
{
    switch (k) {
    case ACT_SIGMOID: return em_sigmoid(x);
    case ACT_TANH: return em_tanh(x);
    case ACT_RELU: return em_relu(x);
    case ACT_SOFTSIGN: return em_softsign(x);
    case ACT_SOFTPLUS: return em_softplus(x);
    case ACT_LEAKY: return em_leaky_relu(x, 0.01);
    case ACT_HARDSIGMOID: return em_clamp(em_add_scalar(em_mul_scalar(x, 0.2), 0.5), 0.0, 1.0);
    case ACT_ELU: return em_elu(x, 1.0);
    default: return em_tanh(x);
    }
}

/* t[i] of a tensor's first dim, without that dim (a view). */
static em_tensor *sel0(em_tensor *t, int64_t i)
{
    return em_squeeze(em_narrow(t, 0, i, 1), 0);
}

static em_tensor *add_opt(em_tensor *a, em_tensor *b)
{
    return b ? em_add(a, b) : a;
}

static em_status check_shape(const char *name, em_tensor *t, int nd, const int64_t *want)
{
    if (em_tensor_ndim(t) != nd) return em_set_error(EM_ERR_SHAPE, "%s must have rank %d (has %d)", name, nd, em_tensor_ndim(t));
    for (int d = 0; d < nd; d++)
        if (em_tensor_dim(t, d) != want[d]) {
            char got[128], exp[128];
            return em_set_error(EM_ERR_SHAPE, "%s has shape %s, expected %s", name, em_shape_str(em_tensor_shape(t), nd, got, sizeof got),
                                em_shape_str(want, nd, exp, sizeof exp));
        }
    return EM_OK;
}

/* RNN (1, 7, 14, 22), GRU (1, 3, 7, 14, 22), LSTM (1, 7, 14, 22): the
 * opset differences are attributes (GRU linear_before_reset from 3, layout
 * from 14; opset 1's output_sequence only made Y optional, which it is
 * anyway). sequence_lens must all equal seq_length; activation_alpha /
 * activation_beta are unsupported. */
static em_status run_recurrent(onnx_ctx *c, int cell)
{
    static const int gates_of[] = {1, 3, 4}, nact_of[] = {1, 2, 3};
    const int G = gates_of[cell], nact = nact_of[cell];
    em_tensor *X = onnx_in_req(c, 0), *W = onnx_in_req(c, 1), *R = onnx_in_req(c, 2);
    if (!X || !W || !R) return em_last_status();
    em_tensor *B = onnx_in(c, 3), *SL = onnx_in(c, 4), *H0 = onnx_in(c, 5);
    em_tensor *C0 = cell == CELL_LSTM ? onnx_in(c, 6) : NULL, *P = cell == CELL_LSTM ? onnx_in(c, 7) : NULL;

    if (em_tensor_ndim(X) != 3) return em_set_error(EM_ERR_SHAPE, "X must have rank 3 (has %d)", em_tensor_ndim(X));
    if (em_tensor_ndim(R) != 3) return em_set_error(EM_ERR_SHAPE, "R must have rank 3 (has %d)", em_tensor_ndim(R));
    em_dtype dt = em_tensor_dtype(X);
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16)
        return em_set_error(EM_ERR_DTYPE, "X must be a float tensor");

    /* half-precision inputs are computed in f32 and rounded once at the end */
    em_dtype odt = dt;
    if (dt == EM_F16 || dt == EM_BF16) {
        dt = EM_F32;
        X = em_cast(X, dt), W = em_cast(W, dt), R = em_cast(R, dt);
        if (B) B = em_cast(B, dt);
        if (H0) H0 = em_cast(H0, dt);
        if (C0) C0 = em_cast(C0, dt);
        if (P) P = em_cast(P, dt);
        if (!X || !W || !R || (onnx_in(c, 3) && !B) || (onnx_in(c, 5) && !H0) || (cell == CELL_LSTM && ((onnx_in(c, 6) && !C0) || (onnx_in(c, 7) && !P))))
            return em_last_status();
    }

    int64_t layout = onnx_attr_int(c, "layout", 0);
    if (layout != 0 && layout != 1) return em_set_error(EM_ERR_INVALID, "layout %lld must be 0 or 1", (long long)layout);
    const char *dir = onnx_attr_string(c, "direction", "forward");
    int nd;
    bool reverse = false;
    if (!strcmp(dir, "forward")) nd = 1;
    else if (!strcmp(dir, "reverse")) nd = 1, reverse = true;
    else if (!strcmp(dir, "bidirectional")) nd = 2;
    else return em_set_error(EM_ERR_INVALID, "direction '%s' is not forward, reverse or bidirectional", dir);

    if (onnx_has_attr(c, "activation_alpha") || onnx_has_attr(c, "activation_beta"))
        return onnx_unsupported(c, "activation_alpha / activation_beta are not supported");
    int acts[6] = {ACT_TANH, ACT_TANH, ACT_TANH, ACT_TANH, ACT_TANH, ACT_TANH};
    if (cell == CELL_GRU) acts[0] = acts[2] = ACT_SIGMOID;
    if (cell == CELL_LSTM) acts[0] = acts[3] = ACT_SIGMOID;
    const Onnx__AttributeProto *aa = onnx_attr(c, "activations");
    if (aa && aa->n_strings > 0) {
        int n = (int)aa->n_strings;
        if (n != nact && n != nact * nd)
            return em_set_error(EM_ERR_INVALID, "activations has %d names, expected %d", n, nact * nd);
        for (int i = 0; i < nact * nd; i++) {
            const ProtobufCBinaryData *s = &aa->strings[i % n];
            int k = act_parse((const char *)s->data, s->len);
            if (k < 0) return onnx_unsupported(c, "activation '%.*s' is not supported", (int)s->len, (const char *)s->data);
            acts[i] = k;
        }
    }
    bool has_clip = onnx_has_attr(c, "clip");
    double clip = onnx_attr_float(c, "clip", 0.0);
    if (has_clip && !(clip > 0)) return em_set_error(EM_ERR_INVALID, "clip %g must be positive", clip);
    bool lbr = cell == CELL_GRU && onnx_attr_int(c, "linear_before_reset", 0) != 0;
    bool input_forget = cell == CELL_LSTM && onnx_attr_int(c, "input_forget", 0) != 0;

    if (layout) {
        X = em_transpose(X, 0, 1);
        if (H0) H0 = em_transpose(H0, 0, 1);
        if (C0) C0 = em_transpose(C0, 0, 1);
        if (!X || (onnx_in(c, 5) && !H0) || (onnx_in(c, 6) && cell == CELL_LSTM && !C0)) return em_last_status();
    }
    const int64_t seq = em_tensor_dim(X, 0), batch = em_tensor_dim(X, 1), nin = em_tensor_dim(X, 2);
    int64_t H = em_tensor_dim(R, 2);
    if (onnx_has_attr(c, "hidden_size") && onnx_attr_int(c, "hidden_size", 0) != H)
        return em_set_error(EM_ERR_SHAPE, "hidden_size %lld does not match R's last dim %lld", (long long)onnx_attr_int(c, "hidden_size", 0), (long long)H);
    if (seq <= 0) return onnx_unsupported(c, "an empty sequence");
    em_status st;
    if ((st = check_shape("W", W, 3, (int64_t[]){nd, G * H, nin}))) return st;
    if ((st = check_shape("R", R, 3, (int64_t[]){nd, G * H, H}))) return st;
    if (B && (st = check_shape("B", B, 2, (int64_t[]){nd, 2 * G * H}))) return st;
    if (H0 && (st = check_shape("initial_h", H0, 3, (int64_t[]){nd, batch, H}))) return st;
    if (C0 && (st = check_shape("initial_c", C0, 3, (int64_t[]){nd, batch, H}))) return st;
    if (P && (st = check_shape("P", P, 2, (int64_t[]){nd, 3 * H}))) return st;
    if (SL) {
        if (batch > 65536) return onnx_unsupported(c, "sequence_lens with more than 65536 entries");
        int64_t *lens = malloc((size_t)batch * sizeof *lens);
        if (!lens) return em_set_error(EM_ERR_NOMEM, "sequence_lens");
        int n = onnx_in_ints(c, 4, lens, (int)batch);
        if (n < 0) { free(lens); return em_last_status(); }
        if (n != batch) { free(lens); return em_set_error(EM_ERR_SHAPE, "sequence_lens has %d entries for batch %lld", n, (long long)batch); }
        for (int i = 0; i < n; i++)
            if (lens[i] != seq) {
                long long l = (long long)lens[i];
                free(lens);
                return onnx_unsupported(c, "sequence_lens %lld differs from seq_length %lld (ragged batches)", l, (long long)seq);
            }
        free(lens);
    }

    em_tensor **steps = malloc((size_t)seq * sizeof *steps);
    if (!steps) return em_set_error(EM_ERR_NOMEM, "time steps");
    em_tensor *ys[2] = {NULL, NULL}, *hs[2] = {NULL, NULL}, *cs[2] = {NULL, NULL};
    for (int d = 0; d < nd; d++) {
        bool back = reverse || d == 1;
        const int *act = acts + d * nact;
        em_tensor *Wd = sel0(W, d), *RdT = em_transpose(sel0(R, d), 0, 1); /* [G*H, in], [H, G*H] */
        em_tensor *XW = em_matmul(X, em_transpose(Wd, 0, 1));                /* [seq, batch, G*H] */
        em_tensor *Rb = NULL, *Pd = P ? sel0(P, d) : NULL;
        if (B) {
            em_tensor *Bd = sel0(B, d);
            XW = em_add(XW, em_narrow(Bd, 0, 0, G * H));
            Rb = em_narrow(Bd, 0, G * H, G * H);
        }
        int64_t bh[2] = {batch, H};
        em_tensor *h = H0 ? sel0(H0, d) : em_zeros(bh, 2, dt);
        em_tensor *cc = cell == CELL_LSTM ? (C0 ? sel0(C0, d) : em_zeros(bh, 2, dt)) : NULL;
        if (!XW || !RdT || !h || (cell == CELL_LSTM && !cc) || (B && !Rb) || (P && !Pd)) { free(steps); return em_last_status(); }
#define CLIP(x) (has_clip ? em_clamp((x), -clip, clip) : (x))
        for (int64_t s = 0; s < seq; s++) {
            int64_t t = back ? seq - 1 - s : s;
            em_scope_begin();
            em_tensor *xt = sel0(XW, t), *nh = NULL, *nc = NULL;
            if (cell == CELL_RNN) {
                nh = act_apply(act[0], CLIP(add_opt(em_add(xt, em_matmul(h, RdT)), Rb)));
            } else if (cell == CELL_GRU) {
                em_tensor *hr = add_opt(em_matmul(h, em_narrow(RdT, 1, 0, 2 * H)), Rb ? em_narrow(Rb, 0, 0, 2 * H) : NULL);
                em_tensor *z = act_apply(act[0], CLIP(em_add(em_narrow(xt, 1, 0, H), em_narrow(hr, 1, 0, H))));
                em_tensor *r = act_apply(act[0], CLIP(em_add(em_narrow(xt, 1, H, H), em_narrow(hr, 1, H, H))));
                em_tensor *RhT = em_narrow(RdT, 1, 2 * H, H), *Rbh = Rb ? em_narrow(Rb, 0, 2 * H, H) : NULL;
                em_tensor *pre = lbr ? em_mul(r, add_opt(em_matmul(h, RhT), Rbh)) : add_opt(em_matmul(em_mul(r, h), RhT), Rbh);
                em_tensor *hh = act_apply(act[1], CLIP(em_add(em_narrow(xt, 1, 2 * H, H), pre)));
                nh = em_add(em_mul(em_rsub_scalar(z, 1.0), hh), em_mul(z, h));
            } else {
                em_tensor *g = add_opt(em_add(xt, em_matmul(h, RdT)), Rb); /* [batch, 4H]: i, o, f, c */
                em_tensor *gi = em_narrow(g, 1, 0, H), *go = em_narrow(g, 1, H, H), *gf = em_narrow(g, 1, 2 * H, H), *gc = em_narrow(g, 1, 3 * H, H);
                if (Pd) {
                    gi = em_add(gi, em_mul(em_narrow(Pd, 0, 0, H), cc));
                    gf = em_add(gf, em_mul(em_narrow(Pd, 0, 2 * H, H), cc));
                }
                em_tensor *i = act_apply(act[0], CLIP(gi));
                em_tensor *f = input_forget ? em_rsub_scalar(i, 1.0) : act_apply(act[0], CLIP(gf));
                em_tensor *ct = act_apply(act[1], CLIP(gc));
                nc = em_add(em_mul(f, cc), em_mul(i, ct));
                if (Pd) go = em_add(go, em_mul(em_narrow(Pd, 0, H, H), nc));
                em_tensor *o = act_apply(act[0], CLIP(go));
                nh = em_mul(o, act_apply(act[2], nc));
            }
            if (!nh || (cell == CELL_LSTM && !nc)) {
                em_status e = em_last_status();
                em_scope_end();
                free(steps);
                return e != EM_OK ? e : em_set_error(EM_ERR_RUNTIME, "time step %lld failed", (long long)t);
            }
            h = em_keep(nh);
            if (nc) cc = em_keep(nc);
            em_scope_end();
            steps[t] = h;
        }
#undef CLIP
        ys[d] = em_stack(steps, (int)seq, 0); /* [seq, batch, H] */
        hs[d] = h;
        cs[d] = cc;
        if (!ys[d]) { free(steps); return em_last_status(); }
    }
    free(steps);
    em_tensor *Y = em_stack(ys, nd, 1), *Yh = em_stack(hs, nd, 0), *Yc = cell == CELL_LSTM ? em_stack(cs, nd, 0) : NULL;
    if (layout) {
        Y = em_permute(Y, (int[]){2, 0, 1, 3}, 4);
        Yh = em_transpose(Yh, 0, 1);
        if (Yc) Yc = em_transpose(Yc, 0, 1);
    }
    if (odt != dt) {
        Y = em_cast(Y, odt), Yh = em_cast(Yh, odt);
        if (Yc) Yc = em_cast(Yc, odt);
    }
    if ((st = onnx_out(c, 0, Y, 0))) return st;
    if ((st = onnx_out(c, 1, Yh, 0))) return st;
    if (cell == CELL_LSTM && (st = onnx_out(c, 2, Yc, 0))) return st;
    return EM_OK;
}

static em_status op_rnn(onnx_ctx *c) { return run_recurrent(c, CELL_RNN); }
static em_status op_gru(onnx_ctx *c) { return run_recurrent(c, CELL_GRU); }
static em_status op_lstm(onnx_ctx *c) { return run_recurrent(c, CELL_LSTM); }

/* ---- integer matmuls ---- */

/* Range of an integer ONNX type; false for others. */
static bool int_range(int type, double *lo, double *hi)
{
    switch (type) {
    case ONNX_INT8: *lo = -128, *hi = 127; return true;
    case ONNX_UINT8: *lo = 0, *hi = 255; return true;
    case ONNX_INT16: *lo = -32768, *hi = 32767; return true;
    case ONNX_UINT16: *lo = 0, *hi = 65535; return true;
    case ONNX_INT32: *lo = -2147483648.0, *hi = 2147483647.0; return true;
    default: return false;
    }
}

/* x - zp in f64 (exact for 8/16-bit values); zp scalar, or 1-D along
 * dim @p axis_from_end of x (1: rows of A, i.e. dim -2 -> shape [M, 1];
 * 0: columns of B, dim -1 -> shape [N]). */
static em_tensor *minus_zp(onnx_ctx *c, em_tensor *x, em_tensor *zp, int row_axis, const char *name)
{
    em_tensor *xd = em_cast(x, EM_F64);
    if (!zp) return xd;
    int64_t n = em_tensor_numel(zp);
    em_tensor *z = em_cast(zp, EM_F64);
    if (n != 1) {
        if (em_tensor_ndim(zp) != 1) { onnx_unsupported(c, "%s of rank %d", name, em_tensor_ndim(zp)); return NULL; }
        int r = em_tensor_ndim(x);
        if (r < 2) { onnx_unsupported(c, "1-D operand with a 1-D %s", name); return NULL; }
        int64_t want = em_tensor_dim(x, row_axis ? r - 2 : r - 1);
        if (n != want) { em_set_error(EM_ERR_SHAPE, "%s has %lld entries, expected 1 or %lld", name, (long long)n, (long long)want); return NULL; }
        if (row_axis) z = em_unsqueeze(z, 1);
    } else {
        z = em_reshape(z, NULL, 0);
    }
    return em_sub(xd, z);
}

/* MatMulInteger (10): (A - a_zero_point) @ (B - b_zero_point) as INT32;
 * a_zero_point scalar or per row of A, b_zero_point scalar or per column of B. */
static em_status op_matmul_integer(onnx_ctx *c)
{
    em_tensor *a = onnx_in_req(c, 0), *b = onnx_in_req(c, 1);
    if (!a || !b) return em_last_status();
    double lo, hi;
    if (!int_range(onnx_in_type(c, 0), &lo, &hi) || !int_range(onnx_in_type(c, 1), &lo, &hi) || onnx_in_type(c, 0) == ONNX_INT32 ||
        onnx_in_type(c, 1) == ONNX_INT32)
        return em_set_error(EM_ERR_DTYPE, "A and B must be 8- or 16-bit integers");
    em_tensor *A = minus_zp(c, a, onnx_in(c, 2), 1, "a_zero_point");
    if (!A) return em_last_status();
    em_tensor *Bm = minus_zp(c, b, onnx_in(c, 3), 0, "b_zero_point");
    if (!Bm) return em_last_status();
    /* f64 sums of products of 17-bit values are exact for K < 2^19 */
    if (em_tensor_dim(a, em_tensor_ndim(a) - 1) > (1 << 19)) return onnx_unsupported(c, "inner dim above 2^19 (f64 exactness)");
    return onnx_out(c, 0, em_cast(em_matmul(A, Bm), EM_I32), ONNX_INT32);
}

/* QLinearMatMul (10, 21): y = saturate(round_half_even((a - a_zp) @ (b - b_zp)
 * * (a_scale * b_scale / y_scale)) + y_zp) in y_zero_point's type; the
 * scale product is formed in the scales' type (21 allows float16 / bfloat16
 * scales), as the reference does. Per-row / per-column scales are broadcast
 * like the zero points. */
static em_status op_qlinear_matmul(onnx_ctx *c)
{
    em_tensor *a = onnx_in_req(c, 0), *as = onnx_in_req(c, 1), *b = onnx_in_req(c, 3), *bs = onnx_in_req(c, 4),
              *ys = onnx_in_req(c, 6);
    if (!a || !as || !b || !bs || !ys) return em_last_status();
    em_tensor *azp = onnx_in(c, 2), *bzp = onnx_in(c, 5), *yzp = onnx_in(c, 7);
    int ytype = yzp ? onnx_in_type(c, 7) : onnx_in_type(c, 0);
    double lo, hi;
    if (!int_range(onnx_in_type(c, 0), &lo, &hi) || !int_range(onnx_in_type(c, 3), &lo, &hi) || !int_range(ytype, &lo, &hi) ||
        ytype == ONNX_INT32)
        return onnx_unsupported(c, "QLinearMatMul on types %d, %d -> %d (integer 8/16-bit only)", onnx_in_type(c, 0), onnx_in_type(c, 3), ytype);
    if (em_tensor_ndim(a) < 2 || em_tensor_ndim(b) < 2) return onnx_unsupported(c, "1-D operands");
    if (em_tensor_numel(ys) != 1) return onnx_unsupported(c, "y_scale with %lld entries", (long long)em_tensor_numel(ys));
    em_dtype ydt;
    if (!onnx_type_to_dtype(ytype, &ydt)) return onnx_unsupported(c, "output type %d", ytype);
    em_tensor *A = minus_zp(c, a, azp, 1, "a_zero_point");
    if (!A) return em_last_status();
    em_tensor *Bm = minus_zp(c, b, bzp, 0, "b_zero_point");
    if (!Bm) return em_last_status();
    if (em_tensor_dim(a, em_tensor_ndim(a) - 1) > (1 << 19)) return onnx_unsupported(c, "inner dim above 2^19 (f64 exactness)");
    em_tensor *acc = em_matmul(A, Bm);
    /* scales: a per row -> [M, 1], b per column -> [N]; product in their type */
    em_tensor *asv = em_tensor_numel(as) == 1 ? em_reshape(as, NULL, 0) : em_unsqueeze(as, 1);
    em_tensor *bsv = em_tensor_numel(bs) == 1 ? em_reshape(bs, NULL, 0) : bs;
    if (em_tensor_numel(as) != 1 && em_tensor_ndim(as) != 1) return onnx_unsupported(c, "a_scale of rank %d", em_tensor_ndim(as));
    if (em_tensor_numel(bs) != 1 && em_tensor_ndim(bs) != 1) return onnx_unsupported(c, "b_scale of rank %d", em_tensor_ndim(bs));
    em_tensor *scale = em_div(em_mul(asv, bsv), em_reshape(ys, NULL, 0));
    em_tensor *d = em_mul(acc, em_cast(scale, EM_F64));
    if (yzp) {
        if (em_tensor_numel(yzp) != 1) return onnx_unsupported(c, "y_zero_point with %lld entries", (long long)em_tensor_numel(yzp));
        d = em_add(d, em_cast(em_reshape(yzp, NULL, 0), EM_F64));
    }
    em_tensor *y = em_cast(em_clamp(em_round(d), lo, hi), ydt);
    return onnx_out(c, 0, y, ytype);
}

const onnx_op onnx_ops_rnn[] = {
    {"RNN", 1, op_rnn},
    {"GRU", 1, op_gru},
    {"LSTM", 1, op_lstm},
    {"MatMulInteger", 10, op_matmul_integer},
    {"QLinearMatMul", 10, op_qlinear_matmul},
    {NULL, 0, NULL},
};
