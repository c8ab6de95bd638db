/* Rotary positional embedding (issue #16, item 2): em_rotary_embedding.
 * Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position
 * Embedding", eq. 34, in the rotate-half convention of GPT-NeoX / Hugging
 * Face LLaMA (apply_rotary_pos_emb). The cos / sin tables are constants
 * computed here in double; the rest is narrow, cat, mul and add, so autodiff
 * gives the backward. */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

em_tensor *em_rotary_embedding(const em_tensor *x, const em_tensor *positions, int64_t offset, double base, int64_t rotary_dim)
{
    static const char *fn = "em_rotary_embedding";
    char sx[160], sp[160];
    if (!x) return em__fail(EM_ERR_INVALID, "%s: x is NULL", fn);
    const em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em__fail(EM_ERR_DTYPE, "%s: x must be float, got %s", fn, em_dtype_name(dt));
    const int nd = em_tensor_ndim(x);
    if (nd < 2) return em__fail(EM_ERR_SHAPE, "%s: x of shape %s, expected [..., T, D] (rank >= 2)", fn, NN_SHAPE(x, sx));
    const int64_t T = em_tensor_dim(x, nd - 2), D = em_tensor_dim(x, nd - 1);
    const int64_t r = rotary_dim == 0 ? D : rotary_dim;
    if (r <= 0 || r > D || r % 2)
        return em__fail(EM_ERR_SHAPE, "%s: rotary_dim %lld (0 = D) must be even and in (0, D = %lld] for x of shape %s", fn,
                        (long long)rotary_dim, (long long)D, NN_SHAPE(x, sx));
    if (!(base > 0) || !isfinite(base)) return em__fail(EM_ERR_INVALID, "%s: base must be > 0 and finite, got %g", fn, base);
    int64_t nb = 1; /* rows of the table: 1, or B for positions [B, T] */
    if (positions) {
        const em_dtype pdt = em_tensor_dtype(positions);
        if (pdt != EM_I64 && pdt != EM_I32)
            return em__fail(EM_ERR_DTYPE, "%s: positions must be int64 or int32, got %s", fn, em_dtype_name(pdt));
        const int pn = em_tensor_ndim(positions);
        const bool ok1 = pn == 1 && em_tensor_dim(positions, 0) == T;
        const bool ok2 = pn == 2 && nd >= 3 && em_tensor_dim(positions, 0) == em_tensor_dim(x, 0) && em_tensor_dim(positions, 1) == T;
        if (!ok1 && !ok2)
            return em__fail(EM_ERR_SHAPE, "%s: positions of shape %s for x of shape %s, expected [T] = [%lld] or [B, T] with x [B, ..., T, D]",
                            fn, NN_SHAPE(positions, sp), NN_SHAPE(x, sx), (long long)T);
        if (pn == 2) nb = em_tensor_dim(positions, 0);
    }
    if (nb * T > ((int64_t)1 << 26) / (r > 0 ? r : 1))
        return em__fail(EM_ERR_INVALID, "%s: table of %lld x %lld x %lld values is too large", fn, (long long)nb, (long long)T,
                        (long long)r);
    const size_t n = (size_t)(nb * T), half = (size_t)(r / 2);
    int64_t *pos = malloc(sizeof(int64_t) * n);
    double *cs = malloc(sizeof(double) * n * (size_t)r * 2);
    if (!pos || !cs) {
        free(pos);
        free(cs);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    }
    em_status st = EM_OK;
    if (positions) {
        em_scope_begin();
        em_tensor *p64 = em_tensor_dtype(positions) == EM_I64 ? (em_tensor *)positions : em_cast(positions, EM_I64);
        st = p64 ? em_to_host(em_contiguous(p64), pos, sizeof(int64_t) * n) : em_last_status();
        em_scope_end();
    } else {
        for (size_t t = 0; t < n; t++) pos[t] = (int64_t)t;
    }
    if (st != EM_OK) {
        free(pos);
        free(cs);
        return NULL;
    }
    /* cs[0 .. n*r): cos table cat(cos a, cos a); cs[n*r ..): the sign-folded sin
     * table cat(-sin a, sin a), so that y = x * cos + cat(x2, x1) * sin_signed
     * = x * cos + rotate_half(x) * sin (rotate_half(x) = cat(-x2, x1)). */
    double *cosv = cs, *sinv = cs + n * (size_t)r;
    for (size_t i = 0; i < half; i++) {
        const double theta = pow(base, -(double)(2 * i) / (double)r); /* RoFormer eq. 15: theta_i = 10000^(-2(i-1)/d), 1-based */
        for (size_t t = 0; t < n; t++) {
            const double a = (double)(pos[t] + offset) * theta;
            const double c = cos(a), s = sin(a);
            cosv[t * (size_t)r + i] = c;
            cosv[t * (size_t)r + i + half] = c;
            sinv[t * (size_t)r + i] = -s;
            sinv[t * (size_t)r + i + half] = s;
        }
    }
    free(pos);
    /* table shape broadcastable to x's rotated part: [T, r], or [B, 1, ..., 1, T, r] */
    int64_t ts[EM_MAX_DIMS];
    int tn = 2;
    if (nb > 1 || (positions && em_tensor_ndim(positions) == 2)) {
        tn = nd;
        ts[0] = nb;
        for (int d = 1; d < nd - 2; d++) ts[d] = 1;
    }
    ts[tn - 2] = T;
    ts[tn - 1] = r;
    em_scope_begin();
    em_tensor *ct, *stt;
    if (dt == EM_F64) {
        ct = em_from_host(cosv, ts, tn, EM_F64);
        stt = em_from_host(sinv, ts, tn, EM_F64);
    } else {
        float *f = malloc(sizeof(float) * n * (size_t)r * 2);
        if (!f) {
            free(cs);
            em_scope_end();
            return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
        }
        for (size_t i = 0; i < n * (size_t)r * 2; i++) f[i] = (float)cs[i];
        ct = em_from_host(f, ts, tn, EM_F32);
        stt = em_from_host(f + n * (size_t)r, ts, tn, EM_F32);
        free(f);
        if (dt != EM_F32) { /* 16-bit x: the tables in x's dtype, rounded once from float */
            ct = em_cast(ct, dt);
            stt = em_cast(stt, dt);
        }
    }
    free(cs);
    const int ld = nd - 1;
    em_tensor *xr = r == D ? (em_tensor *)x : em_narrow(x, ld, 0, r);
    em_tensor *sw[2] = {em_narrow(xr, ld, (int64_t)half, (int64_t)half), em_narrow(xr, ld, 0, (int64_t)half)};
    em_tensor *y = em_add(em_mul(xr, ct), em_mul(sw[0] && sw[1] ? em_cat(sw, 2, ld) : NULL, stt));
    if (y && r < D) {
        em_tensor *parts[2] = {y, em_narrow(x, ld, r, D - r)};
        y = parts[1] ? em_cat(parts, 2, ld) : NULL;
    }
    return nn_return(y);
}
