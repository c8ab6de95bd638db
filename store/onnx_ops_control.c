/* ONNX operators, control flow: If, Loop, Scan. Their bodies are subgraphs
 * (GRAPH attributes) the loader builds with the enclosing graphs as
 * lexical scopes; onnx_run_subgraph runs one once. Only small control
 * values are read on the host (If's condition, Loop's trip count and
 * condition, Scan-8's sequence lengths); tensor data stays in Ember ops.
 * Semantics from onnx/docs/Operators.md (onnx 1.23). */
#include "store/onnx_internal.h"

#include <stdlib.h>
#include <string.h>

#define CF_MAX_VALUES 64 /* the run loop's bound on a node's inputs and outputs */

/* Hands an owned reference to the current scope (a view the scope owns;
 * ours is dropped): public API only, as the fuzz target links libember. */
static em_tensor *to_scope(em_tensor *t)
{
    if (!t) return NULL;
    em_tensor *r = em_reshape(t, em_tensor_shape(t), em_tensor_ndim(t));
    em_tensor_release(t);
    return r;
}

static void release_all(em_tensor **t, int n)
{
    for (int i = 0; i < n; i++) {
        em_tensor_release(t[i]);
        t[i] = NULL;
    }
}

/* If (1, 11, 13, 16, 19, 21, 23, 24, 25): one branch, chosen by the
 * one-element condition; branches yielding sequences or optionals are
 * refused at load (their value types). */
static em_status op_if(onnx_ctx *c)
{
    double cond;
    if (onnx_in_scalar(c, 0, &cond) != EM_OK) return em_last_status();
    const char *br = cond != 0 ? "then_branch" : "else_branch";
    int bin = 0, bout = 0;
    if (onnx_subgraph_arity(c, br, &bin, &bout) != EM_OK) return em_last_status();
    if (bin != 0) return em_set_error(EM_ERR_FORMAT, "%s has %d inputs, If's branches take none", br, bin);
    if (bout != c->nout)
        return em_set_error(EM_ERR_FORMAT, "%s has %d outputs, the node has %d", br, bout, c->nout);
    onnx_value out[CF_MAX_VALUES];
    if (c->nout > CF_MAX_VALUES) return onnx_unsupported(c, "more than %d outputs", CF_MAX_VALUES);
    if (onnx_run_subgraph(c, br, 0, NULL, c->nout, out) != EM_OK) return em_last_status();
    for (int i = 0; i < c->nout; i++)
        if (onnx_out(c, i, out[i].t, out[i].type) != EM_OK) return em_last_status();
    return EM_OK;
}

/* Grows a list of owned tensors by one. */
static em_status push_tensor(em_tensor ***list, int *n, int *capn, em_tensor *t)
{
    if (*n == *capn) {
        int nc = *capn ? *capn * 2 : 16;
        em_tensor **nl = realloc(*list, sizeof **list * (size_t)nc);
        if (!nl) {
            em_tensor_release(t);
            return em_set_error(EM_ERR_NOMEM, "out of memory");
        }
        *list = nl;
        *capn = nc;
    }
    (*list)[(*n)++] = t;
    return EM_OK;
}

/* Loop (1, 11, 13, 16, 19, 21, 23, 24, 25): inputs M (trip count,
 * optional), cond (optional), N loop-carried values; the body takes
 * (iteration number, condition, N values) and gives (condition, N values,
 * K scan values); the node's outputs are the N final values and the K scan
 * values of every iteration stacked on a new axis 0. Sequence-typed values
 * (13+) and optionals (16+) are refused at load (their value types). */
static em_status op_loop(onnx_ctx *c)
{
    int64_t M = INT64_MAX;
    bool has_m = onnx_in(c, 0) != NULL;
    if (has_m) {
        int64_t buf[1];
        int k = onnx_in_ints(c, 0, buf, 1);
        if (k < 0) return em_last_status();
        if (k != 1) return em_set_error(EM_ERR_SHAPE, "trip count M must have one element");
        M = buf[0];
    }
    bool cond = true;
    if (onnx_in(c, 1)) {
        double cv;
        if (onnx_in_scalar(c, 1, &cv) != EM_OK) return em_last_status();
        cond = cv != 0;
    }
    int N = c->nin - 2;
    if (N < 0) return em_set_error(EM_ERR_FORMAT, "Loop needs at least 2 inputs (M, cond), it has %d", c->nin);
    int bin = 0, bout = 0;
    if (onnx_subgraph_arity(c, "body", &bin, &bout) != EM_OK) return em_last_status();
    if (bin != N + 2) return em_set_error(EM_ERR_FORMAT, "body has %d inputs, %d loop-carried values need %d", bin, N, N + 2);
    int K = bout - 1 - N;
    if (K < 0) return em_set_error(EM_ERR_FORMAT, "body has %d outputs, %d loop-carried values need at least %d", bout, N, N + 1);
    if (c->nout > N + K) return em_set_error(EM_ERR_FORMAT, "the node has %d outputs, the body gives %d", c->nout, N + K);
    if (bout > CF_MAX_VALUES) return onnx_unsupported(c, "a body of more than %d outputs", CF_MAX_VALUES);
    em_tensor *carried[CF_MAX_VALUES] = {0};
    int ctype[CF_MAX_VALUES] = {0};
    em_tensor **scan[CF_MAX_VALUES] = {0};
    int sn[CF_MAX_VALUES] = {0}, scap[CF_MAX_VALUES] = {0}, stype[CF_MAX_VALUES] = {0};
    for (int j = 0; j < N; j++) {
        em_tensor *t = onnx_in(c, 2 + j);
        if (!t) return em_set_error(EM_ERR_FORMAT, "loop-carried input %d is omitted", j);
        carried[j] = em_tensor_retain(t);
        ctype[j] = onnx_in_type(c, 2 + j);
    }
    em_status st = EM_OK;
    int64_t iters = 0;
    for (int64_t i = 0; (!has_m || i < M) && cond; i++) {
        em_scope_begin();
        onnx_value in[CF_MAX_VALUES], out[CF_MAX_VALUES];
        in[0] = (onnx_value){em_scalar((double)i, EM_I64), ONNX_INT64};
        in[1] = (onnx_value){em_scalar(1, EM_BOOL), ONNX_BOOL};
        for (int j = 0; j < N; j++) in[2 + j] = (onnx_value){carried[j], ctype[j]};
        if (!in[0].t || !in[1].t) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
        else st = onnx_run_subgraph(c, "body", N + 2, in, bout, out);
        double cv = 0;
        if (st == EM_OK) {
            if (em_tensor_numel(out[0].t) != 1)
                st = em_set_error(EM_ERR_SHAPE, "body's condition output has %lld elements, it must have one",
                                  (long long)em_tensor_numel(out[0].t));
            else st = em_item(out[0].t, &cv);
        }
        if (st == EM_OK) {
            cond = cv != 0;
            for (int j = 0; j < N; j++) {
                em_tensor_release(carried[j]);
                carried[j] = em_tensor_retain(out[1 + j].t);
                ctype[j] = out[1 + j].type;
            }
            for (int k = 0; k < K && st == EM_OK; k++) {
                stype[k] = out[1 + N + k].type;
                st = push_tensor(&scan[k], &sn[k], &scap[k], em_tensor_retain(out[1 + N + k].t));
            }
        }
        em_scope_end();
        if (st != EM_OK) goto out;
        iters++;
    }
    for (int j = 0; j < N && j < c->nout; j++) {
        em_tensor *t = to_scope(carried[j]);
        carried[j] = NULL;
        if ((st = onnx_out(c, j, t, ctype[j])) != EM_OK) goto out;
    }
    for (int k = 0; k < K && N + k < c->nout; k++) {
        if (iters == 0) {
            st = onnx_unsupported(c, "Loop ran no iteration: the shape of scan output %d is not known", k);
            goto out;
        }
        if ((st = onnx_out(c, N + k, em_stack(scan[k], sn[k], 0), stype[k])) != EM_OK) goto out;
    }
out:
    release_all(carried, N);
    for (int k = 0; k < K; k++) {
        release_all(scan[k], sn[k]);
        free(scan[k]);
    }
    return st;
}

/* One scan over @p L steps: N states, M scan inputs (sliced on ax[j],
 * reversed when dir[j]), K scan outputs (stacked on oax[k] of rank+1,
 * reversed when odir[k]). Results are owned references in ost / osc. */
static em_status scan_run(onnx_ctx *c, int N, int M, int K, int64_t L, em_tensor *const *st0, const int *st_type,
                          em_tensor *const *xs, const int *xtype, const int *ax, const int64_t *dir, const int64_t *oax,
                          const int64_t *odir, em_tensor **ost, int *ost_type, em_tensor **osc, int *osc_type)
{
    em_tensor *state[CF_MAX_VALUES] = {0};
    int stype[CF_MAX_VALUES] = {0};
    em_tensor **piece[CF_MAX_VALUES] = {0};
    int pn[CF_MAX_VALUES] = {0}, pcap[CF_MAX_VALUES] = {0}, ptype[CF_MAX_VALUES] = {0};
    for (int j = 0; j < N; j++) {
        state[j] = em_tensor_retain(st0[j]);
        stype[j] = st_type[j];
    }
    em_status st = EM_OK;
    if (L == 0 && K > 0) {
        st = onnx_unsupported(c, "a scan of length 0: the shape of the scan outputs is not known");
        goto out;
    }
    for (int64_t t = 0; t < L; t++) {
        em_scope_begin();
        onnx_value in[CF_MAX_VALUES], out[CF_MAX_VALUES];
        for (int j = 0; j < N; j++) in[j] = (onnx_value){state[j], stype[j]};
        for (int j = 0; j < M; j++) {
            int64_t idx = dir[j] ? L - 1 - t : t;
            in[N + j] = (onnx_value){em_squeeze(em_narrow(xs[j], ax[j], idx, 1), ax[j]), xtype[j]};
            if (!in[N + j].t) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
        }
        if (st == EM_OK) st = onnx_run_subgraph(c, "body", N + M, in, N + K, out);
        if (st == EM_OK) {
            for (int j = 0; j < N; j++) {
                em_tensor_release(state[j]);
                state[j] = em_tensor_retain(out[j].t);
                stype[j] = out[j].type;
            }
            for (int k = 0; k < K && st == EM_OK; k++) {
                ptype[k] = out[N + k].type;
                st = push_tensor(&piece[k], &pn[k], &pcap[k], em_tensor_retain(out[N + k].t));
            }
        }
        em_scope_end();
        if (st != EM_OK) goto out;
    }
    for (int k = 0; k < K; k++) {
        if (odir[k])
            for (int a = 0, b = pn[k] - 1; a < b; a++, b--) {
                em_tensor *tmp = piece[k][a];
                piece[k][a] = piece[k][b];
                piece[k][b] = tmp;
            }
        int axis;
        if ((st = onnx_axis(c, oax[k], em_tensor_ndim(piece[k][0]) + 1, &axis)) != EM_OK) goto out;
        em_tensor *r = em_stack(piece[k], pn[k], axis);
        if (!r) {
            st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
            goto out;
        }
        osc[k] = em_tensor_retain(r); /* also owned by the current scope: kept past it */
        osc_type[k] = ptype[k];
    }
    for (int j = 0; j < N; j++) {
        ost[j] = state[j];
        ost_type[j] = stype[j];
        state[j] = NULL;
    }
out:
    release_all(state, N);
    for (int k = 0; k < K; k++) {
        release_all(piece[k], pn[k]);
        free(piece[k]);
    }
    return st;
}

/* Reads an INTS attribute of @p n values (default 0 each). */
static em_status ints_attr(onnx_ctx *c, const char *name, int n, int64_t *v)
{
    const int64_t *a;
    int k = onnx_attr_ints(c, name, &a);
    for (int i = 0; i < n; i++) v[i] = 0;
    if (k < 0) return EM_OK;
    if (k != n) return em_set_error(EM_ERR_INVALID, "attribute %s has %d values, %d expected", name, k, n);
    for (int i = 0; i < n; i++) v[i] = a[i];
    return EM_OK;
}

/* Shared checks: counts of states (N), scan inputs (M) and scan outputs (K). */
static em_status scan_counts(onnx_ctx *c, int first, int *N, int *M, int *K)
{
    int64_t m = onnx_attr_int(c, "num_scan_inputs", -1);
    int nst = c->nin - first;
    if (m < 1 || m > nst)
        return em_set_error(EM_ERR_INVALID, "num_scan_inputs is %lld, the node has %d state and scan inputs", (long long)m, nst);
    *M = (int)m;
    *N = nst - *M;
    int bin = 0, bout = 0;
    if (onnx_subgraph_arity(c, "body", &bin, &bout) != EM_OK) return em_last_status();
    if (bin != *N + *M) return em_set_error(EM_ERR_FORMAT, "body has %d inputs, the node gives %d", bin, *N + *M);
    *K = bout - *N;
    if (*K < 0) return em_set_error(EM_ERR_FORMAT, "body has %d outputs, %d states need at least that many", bout, *N);
    if (c->nout > *N + *K) return em_set_error(EM_ERR_FORMAT, "the node has %d outputs, the body gives %d", c->nout, *N + *K);
    if (bout > CF_MAX_VALUES || bin > CF_MAX_VALUES) return onnx_unsupported(c, "a body of more than %d inputs or outputs", CF_MAX_VALUES);
    for (int i = first; i < c->nin; i++)
        if (!onnx_in(c, i)) return em_set_error(EM_ERR_FORMAT, "input %d is omitted", i);
    return EM_OK;
}

/* Scan (9, 11, 16, 19, 21, 23, 24, 25): N states then M scan inputs;
 * scan_input_axes / scan_input_directions / scan_output_axes /
 * scan_output_directions (negative axes from 11). */
static em_status op_scan9(onnx_ctx *c)
{
    int N, M, K;
    if (scan_counts(c, 0, &N, &M, &K) != EM_OK) return em_last_status();
    int64_t iax[CF_MAX_VALUES], idir[CF_MAX_VALUES], oax[CF_MAX_VALUES], odir[CF_MAX_VALUES];
    if (ints_attr(c, "scan_input_axes", M, iax) != EM_OK || ints_attr(c, "scan_input_directions", M, idir) != EM_OK ||
        ints_attr(c, "scan_output_axes", K, oax) != EM_OK || ints_attr(c, "scan_output_directions", K, odir) != EM_OK)
        return em_last_status();
    em_tensor *st0[CF_MAX_VALUES], *xs[CF_MAX_VALUES];
    int stt[CF_MAX_VALUES], xt[CF_MAX_VALUES], ax[CF_MAX_VALUES];
    int64_t L = -1;
    for (int j = 0; j < N; j++) {
        st0[j] = onnx_in(c, j);
        stt[j] = onnx_in_type(c, j);
    }
    for (int j = 0; j < M; j++) {
        xs[j] = onnx_in(c, N + j);
        xt[j] = onnx_in_type(c, N + j);
        if (em_tensor_ndim(xs[j]) < 1) return em_set_error(EM_ERR_SHAPE, "scan input %d is a scalar", j);
        if (onnx_axis(c, iax[j], em_tensor_ndim(xs[j]), &ax[j]) != EM_OK) return em_last_status();
        int64_t l = em_tensor_dim(xs[j], ax[j]);
        if (L >= 0 && l != L)
            return em_set_error(EM_ERR_SHAPE, "scan input %d has %lld steps on axis %d, scan input 0 has %lld", j, (long long)l,
                                ax[j], (long long)L);
        L = l;
    }
    em_tensor *ost[CF_MAX_VALUES] = {0}, *osc[CF_MAX_VALUES] = {0};
    int ostt[CF_MAX_VALUES], osct[CF_MAX_VALUES];
    em_status st = scan_run(c, N, M, K, L, st0, stt, xs, xt, ax, idir, oax, odir, ost, ostt, osc, osct);
    if (st != EM_OK) return st;
    for (int j = 0; j < N; j++) {
        em_tensor *t = to_scope(ost[j]);
        if (st == EM_OK) st = onnx_out(c, j, t, ostt[j]);
    }
    for (int k = 0; k < K; k++) {
        em_tensor *t = to_scope(osc[k]);
        if (st == EM_OK) st = onnx_out(c, N + k, t, osct[k]);
    }
    return st;
}

/* Scan (8): input 0 sequence_lens (optional), then N states [B, ...] and M
 * scan inputs [B, L, ...]; attribute directions (M). Each batch entry is
 * scanned on its own; sequence lengths shorter than L (padding) are
 * unsupported. */
static em_status op_scan8(onnx_ctx *c)
{
    int N, M, K;
    if (scan_counts(c, 1, &N, &M, &K) != EM_OK) return em_last_status();
    int64_t idir[CF_MAX_VALUES], zero[CF_MAX_VALUES] = {0};
    if (ints_attr(c, "directions", M, idir) != EM_OK) return em_last_status();
    em_tensor *st_all[CF_MAX_VALUES], *xs_all[CF_MAX_VALUES];
    int stt[CF_MAX_VALUES], xt[CF_MAX_VALUES], ax[CF_MAX_VALUES];
    int64_t B = -1, L = -1;
    for (int j = 0; j < N + M; j++) {
        em_tensor *t = onnx_in(c, 1 + j);
        int need = j < N ? 1 : 2;
        if (em_tensor_ndim(t) < need)
            return em_set_error(EM_ERR_SHAPE, "%s %d has rank %d, it needs a batch axis%s", j < N ? "state" : "scan input",
                                j < N ? j : j - N, em_tensor_ndim(t), j < N ? "" : " and a sequence axis");
        if (B >= 0 && em_tensor_dim(t, 0) != B)
            return em_set_error(EM_ERR_SHAPE, "input %d has batch size %lld, input 1 has %lld", 1 + j,
                                (long long)em_tensor_dim(t, 0), (long long)B);
        B = em_tensor_dim(t, 0);
        if (j < N) {
            st_all[j] = t;
            stt[j] = onnx_in_type(c, 1 + j);
        } else {
            int64_t l = em_tensor_dim(t, 1);
            if (L >= 0 && l != L)
                return em_set_error(EM_ERR_SHAPE, "scan input %d has %lld steps, scan input 0 has %lld", j - N, (long long)l,
                                    (long long)L);
            L = l;
            xs_all[j - N] = t;
            xt[j - N] = onnx_in_type(c, 1 + j);
            ax[j - N] = 0;
        }
    }
    if (onnx_in(c, 0)) {
        int64_t *lens = malloc(sizeof(int64_t) * (size_t)(B + 1));
        if (!lens) return em_set_error(EM_ERR_NOMEM, "out of memory");
        int n = onnx_in_ints(c, 0, lens, (int)B);
        bool ok = n == B;
        for (int b = 0; ok && b < B; b++) ok = lens[b] == L;
        free(lens);
        if (n < 0) return em_last_status();
        if (!ok) return onnx_unsupported(c, "Scan-8 sequence_lens other than the full length %lld", (long long)L);
    }
    /* per batch entry: results collected, then stacked on axis 0 */
    em_tensor **res = calloc((size_t)(N + K) * (size_t)(B > 0 ? B : 1), sizeof *res);
    if (!res) return em_set_error(EM_ERR_NOMEM, "out of memory");
    int rtype[CF_MAX_VALUES] = {0};
    em_status st = EM_OK;
    if (B == 0) st = onnx_unsupported(c, "Scan-8 with batch size 0");
    for (int64_t b = 0; b < B && st == EM_OK; b++) {
        em_scope_begin();
        em_tensor *st0[CF_MAX_VALUES], *xs[CF_MAX_VALUES];
        for (int j = 0; j < N; j++) st0[j] = em_squeeze(em_narrow(st_all[j], 0, b, 1), 0);
        for (int j = 0; j < M; j++) xs[j] = em_squeeze(em_narrow(xs_all[j], 0, b, 1), 0);
        for (int j = 0; j < N && st == EM_OK; j++)
            if (!st0[j]) st = em_last_status();
        for (int j = 0; j < M && st == EM_OK; j++)
            if (!xs[j]) st = em_last_status();
        if (st == EM_OK)
            st = scan_run(c, N, M, K, L, st0, stt, xs, xt, ax, idir, zero, zero, res + b * (N + K), rtype, res + b * (N + K) + N,
                          rtype + N);
        em_scope_end();
    }
    for (int i = 0; i < N + K && st == EM_OK; i++) {
        em_tensor **col = malloc(sizeof *col * (size_t)B);
        if (!col) {
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
            break;
        }
        for (int64_t b = 0; b < B; b++) col[b] = res[b * (N + K) + i];
        em_tensor *t = em_stack(col, (int)B, 0);
        free(col);
        st = onnx_out(c, i, t, rtype[i]);
    }
    for (int64_t i = 0; i < (N + K) * (B > 0 ? B : 1); i++) em_tensor_release(res[i]);
    free(res);
    return st;
}

const onnx_op onnx_ops_control[] = {
    {"If", 1, op_if},
    {"Loop", 1, op_loop},
    {"Scan", 8, op_scan8},
    {"Scan", 9, op_scan9},
    {NULL, 0, NULL},
};
