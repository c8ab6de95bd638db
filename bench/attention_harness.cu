/* Standalone test and benchmark of the CUDA fused attention kernels
 * (devices/cuda/attention.cu), without StarPU: it calls
 * emc::attention_launch directly on the default stream.
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -I. -Iinclude -I/opt/ember-deps/include/starpu/1.4 \
 *        bench/attention_harness.cu devices/cuda/attention.cu -o attention_harness
 *   ./attention_harness [--no-test] [--no-bench] [--times FILE]
 *
 * (1) correctness: random inputs, forward o / lse and backward dq / dk / dv
 *     against a naive double-precision CPU reference of the contract's
 *     formulas (the same philox keep mask), over causal / not, masks with
 *     broadcasting, Tq != Tk, odd T, head dims 1..256 and D != Dv, strided
 *     views (q, k, v in one [B, T, 3, H, D] layout, o and dout as
 *     [B, T, H, Dv]), dropout, fully masked rows, f32 / f64 / f16 / bf16.
 *     The backward is fed the kernel's own o and lse, as in training.
 *     Error = max |gpu - ref| / max(max |ref|, 1) per tensor (the floor 1, the
 *     inputs' scale, for gradients that cancel to ~0, e.g. a row that sees one
 *     key; lse: max |gpu - ref| / (1 + |ref|)); NaN / inf must match exactly. Tolerances per dtype in tol().
 *     Storage outside the views is NaN, so a stray read shows.
 * (2) timing: forward and backward, median of 20 after warm-up (cudaEvent).
 * Exit status 1 on any failure. */
#include "devices/cuda/emcuda.h"
#include "devices/philox.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

/* ---- the two StarPU-side symbols attention.cu references ----------------- */
static int g_cuda_errors = 0;
namespace emc {
void check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    g_cuda_errors++;
    fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
}
} // namespace emc
extern "C" cudaStream_t starpu_cuda_get_local_stream(void) { return 0; }

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static const double NEG_INF = -INFINITY;

static int esize(int dt) { return dt == EM_F64 ? 8 : dt == EM_F32 ? 4 : 2; }
static const char *dtname(int dt) { return dt == EM_F64 ? "f64" : dt == EM_F32 ? "f32" : dt == EM_F16 ? "f16" : "bf16"; }

/* Round x to dtype dt (the value the device will see). */
static double round_to(int dt, double x)
{
    switch (dt) {
    case EM_F64: return x;
    case EM_F32: return (double)(float)x;
    case EM_F16: return (double)__half2float(__float2half_rn((float)x));
    default: return (double)__bfloat162float(__float2bfloat16_rn((float)x));
    }
}
static void put(int dt, void *p, int64_t i, double x)
{
    switch (dt) {
    case EM_F64: ((double *)p)[i] = x; break;
    case EM_F32: ((float *)p)[i] = (float)x; break;
    case EM_F16: { __half h = __float2half_rn((float)x); memcpy((char *)p + 2 * i, &h, 2); } break;
    default: { __nv_bfloat16 h = __float2bfloat16_rn((float)x); memcpy((char *)p + 2 * i, &h, 2); } break;
    }
}
static double get(int dt, const void *p, int64_t i)
{
    switch (dt) {
    case EM_F64: return ((const double *)p)[i];
    case EM_F32: return ((const float *)p)[i];
    case EM_F16: { __half h; memcpy(&h, (const char *)p + 2 * i, 2); return __half2float(h); }
    default: { __nv_bfloat16 h; memcpy(&h, (const char *)p + 2 * i, 2); return __bfloat162float(h); }
    }
}

/* A device tensor: logical [d0, d1, d2, d3] (ndim 4, or 3 for lse) with
 * element strides, in an allocation of nalloc elements (NaN elsewhere). */
struct DT {
    int dt = EM_F32, ndim = 4;
    int64_t shape[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0}, nalloc = 0;
    void *dev = nullptr;
    int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
    int64_t off(int64_t i) const /* logical C-order index -> storage offset */
    {
        int64_t o = 0;
        for (int d = 3; d >= 0; d--) {
            o += (i % shape[d]) * st[d];
            i /= shape[d];
        }
        return o;
    }
    em_tdesc desc() const
    {
        em_tdesc d;
        memset(&d, 0, sizeof d);
        d.dtype = dt;
        d.ndim = ndim;
        d.offset = 0;
        const int first = 4 - ndim; /* a 3-d tensor keeps dims 1..3 of shape[] */
        for (int k = 0; k < ndim; k++) {
            d.shape[k] = shape[first + k];
            d.strides[k] = st[first + k];
        }
        return d;
    }
};

static DT make(int dt, int64_t a, int64_t b, int64_t c, int64_t d, const int64_t *strides /* null: contiguous */, int64_t nalloc)
{
    DT t;
    t.dt = dt;
    t.shape[0] = a; t.shape[1] = b; t.shape[2] = c; t.shape[3] = d;
    if (strides) {
        for (int k = 0; k < 4; k++) t.st[k] = strides[k];
        t.nalloc = nalloc;
    } else {
        t.st[3] = 1; t.st[2] = d; t.st[1] = c * d; t.st[0] = b * c * d;
        t.nalloc = a * b * c * d;
    }
    CK(cudaMalloc(&t.dev, (size_t)std::max<int64_t>(t.nalloc, 1) * esize(dt)));
    std::vector<char> h((size_t)std::max<int64_t>(t.nalloc, 1) * esize(dt));
    for (int64_t i = 0; i < t.nalloc; i++) put(dt, h.data(), i, NAN);
    CK(cudaMemcpy(t.dev, h.data(), h.size(), cudaMemcpyHostToDevice));
    return t;
}
static void upload(const DT &t, const std::vector<double> &v)
{
    std::vector<char> h((size_t)std::max<int64_t>(t.nalloc, 1) * esize(t.dt));
    CK(cudaMemcpy(h.data(), t.dev, h.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < t.numel(); i++) put(t.dt, h.data(), t.off(i), v[i]);
    CK(cudaMemcpy(t.dev, h.data(), h.size(), cudaMemcpyHostToDevice));
}
static std::vector<double> download(const DT &t)
{
    std::vector<char> h((size_t)std::max<int64_t>(t.nalloc, 1) * esize(t.dt));
    CK(cudaMemcpy(h.data(), t.dev, h.size(), cudaMemcpyDeviceToHost));
    std::vector<double> v(t.numel());
    for (int64_t i = 0; i < t.numel(); i++) v[i] = get(t.dt, h.data(), t.off(i));
    return v;
}
static void release(DT &t)
{
    if (t.dev) cudaFree(t.dev);
    t.dev = nullptr;
}

/* ---- cases ------------------------------------------------------------------ */

enum { M_NONE, M_FULL, M_BCAST, M_KEYPAD, M_ROWS };
enum { L_CONTIG, L_PACKED };

struct Case {
    int dt, B, H, Tq, Tk, D, Dv, causal, mask, layout;
    double p, scale; /* scale <= 0: 1 / sqrt(D) */
};

static std::string case_name(const Case &c)
{
    static const char *mn[] = {"nomask", "mask", "mask-bcast", "mask-keypad", "mask-fullrows"};
    char s[256];
    snprintf(s, sizeof s, "%-4s B%d H%d Tq%d Tk%d D%d Dv%d %s %s %s p%.2g", dtname(c.dt), c.B, c.H, c.Tq, c.Tk, c.D, c.Dv,
             c.causal ? "causal" : "full", mn[c.mask], c.layout == L_PACKED ? "packed" : "contig", c.p);
    return s;
}

static void tol(int dt, double *t_out, double *t_lse, double *t_grad)
{
    switch (dt) {
    case EM_F64: *t_out = 1e-10; *t_lse = 1e-11; *t_grad = 1e-10; break;
    case EM_F32: *t_out = 1e-5; *t_lse = 2e-6; *t_grad = 1e-5; break;
    case EM_F16: *t_out = 3e-3; *t_lse = 2e-5; *t_grad = 5e-3; break;
    default: *t_out = 1.5e-2; *t_lse = 2e-5; *t_grad = 2.5e-2; break;
    }
}

/* Compares gpu against ref: NaN / inf positions must agree; returns the error. */
static double compare(const std::vector<double> &g, const std::vector<double> &r, bool lse_mode, int64_t *bad, double floor_ = 1.0)
{
    double maxref = 0, maxdiff = 0;
    *bad = 0;
    for (size_t i = 0; i < r.size(); i++)
        if (std::isfinite(r[i])) maxref = std::max(maxref, std::fabs(r[i]));
    for (size_t i = 0; i < r.size(); i++) {
        if (!std::isfinite(r[i]) || !std::isfinite(g[i])) {
            const bool same = (std::isnan(r[i]) && std::isnan(g[i])) || (r[i] == g[i]);
            if (!same) (*bad)++;
            continue;
        }
        const double d = std::fabs(g[i] - r[i]);
        maxdiff = std::max(maxdiff, lse_mode ? d / (1 + std::fabs(r[i])) : d);
    }
    if (lse_mode) return maxdiff;
    return maxdiff / std::max(maxref, floor_);
}

static bool keep_ref(uint64_t seed, uint64_t offset, double p, uint64_t e)
{
    if (p == 0) return true;
    uint32_t w[4];
    em_philox4x32_10(offset + e, seed, w);
    return em_philox_u01(w[0]) >= p;
}

static int g_pass = 0, g_fail = 0;

/* fn(i) for i < n on the host's cores (the reference, one (b, h) each). */
template <typename F> static void parallel_for(size_t n, F fn)
{
    std::atomic<size_t> next(0);
    unsigned nt = std::max(1u, std::min(std::thread::hardware_concurrency(), 32u));
    std::vector<std::thread> th;
    for (unsigned t = 0; t < nt; t++)
        th.emplace_back([&] {
            for (size_t i; (i = next++) < n;) fn(i);
        });
    for (auto &t : th) t.join();
}

static bool run_case(const Case &c, std::mt19937_64 &rng)
{
    const int B = c.B, H = c.H, Tq = c.Tq, Tk = c.Tk, D = c.D, Dv = c.Dv, dt = c.dt;
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt((double)D);
    const uint64_t seed = 0x1234abcdULL + rng() % 1000, offset = rng() % 100000;
    std::uniform_real_distribution<double> U(-2.0, 2.0), U01(0.0, 1.0);
    auto randv = [&](int64_t n) {
        std::vector<double> v(n);
        for (auto &x : v) x = round_to(dt, U(rng));
        return v;
    };
    /* operands */
    DT q, k, v, dout, o;
    if (c.layout == L_PACKED) { /* q, k, v views of one [B, T, 3, H, D] layout; o, dout as [B, T, H, Dv] */
        const int64_t T = Tq; /* packed cases have Tq == Tk, D == Dv */
        const int64_t s[4] = {T * 3 * H * D, D, 3 * H * D, 1};
        q = make(dt, B, H, Tq, D, s, B * T * 3 * H * D);
        k = make(dt, B, H, Tk, D, s, B * T * 3 * H * D);
        v = make(dt, B, H, Tk, Dv, s, B * T * 3 * H * D);
        const int64_t so[4] = {(int64_t)Tq * H * Dv, Dv, (int64_t)H * Dv, 1};
        o = make(dt, B, H, Tq, Dv, so, (int64_t)B * Tq * H * Dv);
        dout = make(dt, B, H, Tq, Dv, so, (int64_t)B * Tq * H * Dv);
    } else {
        q = make(dt, B, H, Tq, D, nullptr, 0);
        k = make(dt, B, H, Tk, D, nullptr, 0);
        v = make(dt, B, H, Tk, Dv, nullptr, 0);
        o = make(dt, B, H, Tq, Dv, nullptr, 0);
        dout = make(dt, B, H, Tq, Dv, nullptr, 0);
    }
    const int ldt = dt == EM_F64 ? EM_F64 : EM_F32;
    DT lse = make(ldt, 1, B, H, Tq, nullptr, 0);
    lse.ndim = 3;
    DT dq = make(dt, B, H, Tq, D, nullptr, 0), dk = make(dt, B, H, Tk, D, nullptr, 0), dv = make(dt, B, H, Tk, Dv, nullptr, 0);
    std::vector<double> hq = randv((int64_t)B * H * Tq * D), hk = randv((int64_t)B * H * Tk * D),
                        hv = randv((int64_t)B * H * Tk * Dv), hdo = randv((int64_t)B * H * Tq * Dv);
    upload(q, hq);
    upload(k, hk);
    upload(v, hv);
    upload(dout, hdo);
    /* mask: logical [B, H, Tq, Tk] values (ref) and its storage */
    DT mk;
    std::vector<double> hm; /* full logical values */
    if (c.mask != M_NONE) {
        hm.assign((size_t)B * H * Tq * Tk, 0.0);
        if (c.mask == M_FULL || c.mask == M_ROWS) {
            mk = make(dt, B, H, Tq, Tk, nullptr, 0);
            for (auto &x : hm) x = U01(rng) < 0.15 ? NEG_INF : round_to(dt, U(rng));
            if (c.mask == M_ROWS) /* some rows entirely masked */
                for (int b = 0; b < B; b++)
                    for (int h = 0; h < H; h++)
                        for (int i = 0; i < Tq; i++)
                            if ((i * 7 + b + h) % 5 == 0)
                                for (int j = 0; j < Tk; j++) hm[(((size_t)b * H + h) * Tq + i) * Tk + j] = NEG_INF;
            upload(mk, hm);
        } else if (c.mask == M_BCAST) { /* [1, 1, Tq, Tk] broadcast: strides 0 on B, H */
            const int64_t s[4] = {0, 0, Tk, 1};
            mk = make(dt, B, H, Tq, Tk, s, (int64_t)Tq * Tk);
            std::vector<double> base((size_t)Tq * Tk);
            for (auto &x : base) x = U01(rng) < 0.1 ? NEG_INF : round_to(dt, U(rng));
            for (size_t e = 0; e < hm.size(); e++) hm[e] = base[e % ((size_t)Tq * Tk)];
            /* upload through the view: every (b, h) writes the same element */
            upload(mk, hm);
        } else { /* M_KEYPAD: [B, 1, 1, Tk], the last keys of each batch masked */
            const int64_t s[4] = {Tk, 0, 0, 1};
            mk = make(dt, B, H, Tq, Tk, s, (int64_t)B * Tk);
            for (int b = 0; b < B; b++) {
                const int valid = std::max(1, Tk - 1 - (b * 3) % std::max(1, Tk / 2));
                for (size_t e = 0; e < (size_t)H * Tq * Tk; e++) hm[(size_t)b * H * Tq * Tk + e] = (int)(e % Tk) < valid ? 0.0 : NEG_INF;
            }
            upload(mk, hm);
        }
    }
    /* ---- GPU forward ---- */
    em_kargs ka;
    memset(&ka, 0, sizeof ka);
    ka.kind = EM_OP_SDPA;
    ka.p.attn.scale = scale;
    ka.p.attn.dropout_p = c.p;
    ka.p.attn.seed = seed;
    ka.p.attn.offset = offset;
    ka.p.attn.is_causal = c.causal;
    ka.p.attn.has_mask = c.mask != M_NONE;
    ka.n_in = 3 + (c.mask != M_NONE);
    ka.n_out = 2;
    ka.in[0] = q.desc();
    ka.in[1] = k.desc();
    ka.in[2] = v.desc();
    if (c.mask != M_NONE) ka.in[3] = mk.desc();
    ka.out[0] = o.desc();
    ka.out[1] = lse.desc();
    void *pf[8] = {q.dev, k.dev, v.dev, c.mask != M_NONE ? mk.dev : nullptr};
    pf[ka.n_in] = o.dev;
    pf[ka.n_in + 1] = lse.dev;
    const int err0 = g_cuda_errors;
    emc::attention_launch(&ka, pf, 0);
    /* ---- GPU backward (fed the forward's o and lse) ---- */
    em_kargs kb = ka;
    kb.kind = EM_OP_SDPA_BWD;
    kb.n_in = 6 + (c.mask != M_NONE);
    kb.n_out = 3;
    kb.in[0] = dout.desc();
    kb.in[1] = q.desc();
    kb.in[2] = k.desc();
    kb.in[3] = v.desc();
    kb.in[4] = o.desc();
    kb.in[5] = lse.desc();
    if (c.mask != M_NONE) kb.in[6] = mk.desc();
    kb.out[0] = dq.desc();
    kb.out[1] = dk.desc();
    kb.out[2] = dv.desc();
    void *pb[10] = {dout.dev, q.dev, k.dev, v.dev, o.dev, lse.dev, c.mask != M_NONE ? mk.dev : nullptr};
    pb[kb.n_in] = dq.dev;
    pb[kb.n_in + 1] = dk.dev;
    pb[kb.n_in + 2] = dv.dev;
    emc::attention_launch(&kb, pb, 0);
    CK(cudaDeviceSynchronize());
    const bool launch_ok = g_cuda_errors == err0;
    std::vector<double> go = download(o), gl = download(lse), gdq = download(dq), gdk = download(dk), gdv = download(dv);

    /* ---- reference (double) ---- */
    std::vector<double> ro((size_t)B * H * Tq * Dv), rl((size_t)B * H * Tq), rdq((size_t)B * H * Tq * D, 0.0),
        rdk((size_t)B * H * Tk * D, 0.0), rdv((size_t)B * H * Tk * Dv, 0.0);
    const double rp = c.p < 1 ? 1.0 / (1.0 - c.p) : 0.0;
    auto ref_head = [&](size_t bh) {
        {
            std::vector<double> s(Tk), pz(Tk), pr(Tk);
            for (int i = 0; i < Tq; i++) {
                const double *qi = &hq[(bh * Tq + i) * D];
                double m = NEG_INF;
                for (int j = 0; j < Tk; j++) {
                    const double *kj = &hk[(bh * Tk + j) * D];
                    double acc = 0;
                    for (int d = 0; d < D; d++) acc += qi[d] * kj[d];
                    double x = scale * acc;
                    if (!hm.empty()) x += hm[(bh * Tq + i) * Tk + j];
                    if (c.causal && j > i) x = NEG_INF;
                    s[j] = x;
                    m = std::max(m, x);
                }
                double l = 0;
                for (int j = 0; j < Tk; j++) l += s[j] == NEG_INF ? 0.0 : std::exp(s[j] - m);
                const double L = m + std::log(l); /* -inf when every key is masked */
                rl[bh * Tq + i] = L;
                for (int j = 0; j < Tk; j++) {
                    const double p = (L == NEG_INF || s[j] == NEG_INF) ? 0.0 : std::exp(s[j] - L);
                    const bool kp = keep_ref(seed, offset, c.p, (uint64_t)(bh * Tq + i) * Tk + j);
                    pr[j] = p;
                    pz[j] = kp ? p * rp : 0.0;
                }
                double *oi = &ro[(bh * Tq + i) * Dv];
                for (int n = 0; n < Dv; n++) {
                    double acc = 0;
                    for (int j = 0; j < Tk; j++) acc += pz[j] * hv[(bh * Tk + j) * Dv + n];
                    oi[n] = L == NEG_INF ? NAN : acc;
                }
                if (L == NEG_INF) continue; /* backward: the row contributes nothing */
                const double *doi = &hdo[(bh * Tq + i) * Dv];
                double delta = 0;
                for (int n = 0; n < Dv; n++) delta += doi[n] * oi[n];
                for (int j = 0; j < Tk; j++) {
                    if (pr[j] == 0) continue;
                    const double z = pr[j] == 0 ? 0 : pz[j] / pr[j];
                    double dp = 0;
                    for (int n = 0; n < Dv; n++) dp += doi[n] * hv[(bh * Tk + j) * Dv + n];
                    dp *= z;
                    const double ds = pr[j] * (dp - delta);
                    for (int d = 0; d < D; d++) {
                        rdq[(bh * Tq + i) * D + d] += scale * ds * hk[(bh * Tk + j) * D + d];
                        rdk[(bh * Tk + j) * D + d] += scale * ds * qi[d];
                    }
                    for (int n = 0; n < Dv; n++) rdv[(bh * Tk + j) * Dv + n] += pz[j] * doi[n];
                }
            }
        }
    };
    parallel_for((size_t)B * H, ref_head);
    double to, tl, tg;
    tol(dt, &to, &tl, &tg);
    int64_t b1, b2, b3, b4, b5;
    const double eo = compare(go, ro, false, &b1), el = compare(gl, rl, true, &b2), eq = compare(gdq, rdq, false, &b3),
                 ek = compare(gdk, rdk, false, &b4), ev = compare(gdv, rdv, false, &b5);
    const bool ok = launch_ok && eo <= to && el <= tl && eq <= tg && ek <= tg && ev <= tg && b1 + b2 + b3 + b4 + b5 == 0;
    printf("%s  %-72s o %.1e lse %.1e dq %.1e dk %.1e dv %.1e%s%s\n", ok ? "PASS" : "FAIL", case_name(c).c_str(), eo, el, eq,
           ek, ev, b1 + b2 + b3 + b4 + b5 ? "  (NaN/inf mismatch)" : "", launch_ok ? "" : "  (launch error)");
    if (!ok && b1 + b2 + b3 + b4 + b5)
        printf("      nonfinite mismatches: o %lld lse %lld dq %lld dk %lld dv %lld\n", (long long)b1, (long long)b2,
               (long long)b3, (long long)b4, (long long)b5);
    (ok ? g_pass : g_fail)++;
    DT *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv, &mk};
    for (DT *t : all) release(*t);
    return ok;
}

/* Operand validation: a bad dtype must be reported, never a silent return. */
static void check_rejects()
{
    em_kargs ka;
    memset(&ka, 0, sizeof ka);
    ka.kind = EM_OP_SDPA;
    ka.n_in = 3;
    ka.n_out = 2;
    for (int i = 0; i < 3; i++) {
        ka.in[i].dtype = EM_I32;
        ka.in[i].ndim = 4;
        for (int d = 0; d < 4; d++) ka.in[i].shape[d] = 2;
        ka.in[i].strides[3] = 1;
    }
    void *p[8] = {};
    const int e0 = g_cuda_errors;
    fprintf(stderr, "(expected) ");
    emc::attention_launch(&ka, p, 0);
    const bool ok = g_cuda_errors == e0 + 1;
    g_cuda_errors = e0;
    printf("%s  rejects an i32 operand with an error (no silent return)\n", ok ? "PASS" : "FAIL");
    (ok ? g_pass : g_fail)++;
}

static void tests()
{
    std::mt19937_64 rng(42);
    const int dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int dt : dts) {
        std::vector<Case> cs = {
            /* dt, B, H, Tq, Tk, D, Dv, causal, mask, layout, p, scale */
            {dt, 2, 3, 33, 33, 64, 64, 0, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 3, 130, 130, 64, 64, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 1, 1, 1, 1, 0, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 1, 7, 32, 32, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 2, 7, 130, 32, 32, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 2, 130, 7, 32, 32, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 2, 33, 257, 64, 64, 0, M_NONE, L_CONTIG, 0, 0.3},
            {dt, 1, 2, 257, 257, 128, 128, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 257, 33, 1, 1, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 2, 33, 65, 80, 48, 0, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 2, 65, 33, 48, 80, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 130, 130, 256, 256, 1, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 33, 130, 256, 16, 0, M_NONE, L_CONTIG, 0, 0},
            {dt, 1, 2, 130, 33, 16, 256, 0, M_NONE, L_CONTIG, 0, 0},
            {dt, 2, 3, 33, 65, 64, 64, 0, M_FULL, L_CONTIG, 0, 0},
            {dt, 2, 3, 130, 130, 64, 64, 1, M_BCAST, L_CONTIG, 0, 0},
            {dt, 3, 2, 33, 130, 80, 80, 0, M_KEYPAD, L_CONTIG, 0, 0},
            {dt, 2, 2, 65, 65, 32, 32, 0, M_ROWS, L_CONTIG, 0, 0},
            {dt, 2, 2, 65, 65, 32, 32, 1, M_ROWS, L_CONTIG, 0.2, 0},
            {dt, 2, 3, 130, 130, 64, 64, 1, M_NONE, L_PACKED, 0, 0},
            {dt, 2, 3, 257, 257, 32, 32, 0, M_BCAST, L_PACKED, 0, 0},
            {dt, 2, 3, 130, 130, 64, 64, 1, M_NONE, L_CONTIG, 0.2, 0},
            {dt, 2, 2, 33, 130, 128, 128, 0, M_FULL, L_CONTIG, 0.2, 0},
            {dt, 2, 3, 130, 130, 64, 64, 1, M_NONE, L_PACKED, 0.2, 0},
            {dt, 1, 2, 33, 33, 64, 64, 0, M_NONE, L_CONTIG, 1.0, 0},
        };
        for (const Case &c : cs) run_case(c, rng);
    }
    check_rejects();
}

/* ---- timing ----------------------------------------------------------------- */

static void bench(FILE *tf)
{
    struct Shape { int B, H, T, D, dt; double p; };
    const Shape shapes[] = {
        {8, 12, 256, 64, EM_F32, 0},  {8, 12, 1024, 64, EM_F32, 0},  {8, 12, 4096, 64, EM_F32, 0},
        {8, 12, 256, 64, EM_BF16, 0}, {8, 12, 1024, 64, EM_BF16, 0}, {8, 12, 4096, 64, EM_BF16, 0},
        {64, 6, 256, 64, EM_F32, 0.2}, {64, 6, 256, 64, EM_BF16, 0.2},
        /* ember only (no torch column) */
        {64, 6, 256, 64, EM_F32, 0}, {8, 12, 1024, 128, EM_F32, 0}, {8, 12, 1024, 64, EM_F64, 0}, {8, 12, 1024, 64, EM_F16, 0},
    };
    printf("\nTiming (causal; median of 20 after 3 warm-up; ms)\n");
    printf("%-28s %9s %9s %9s %8s\n", "shape", "fwd", "bwd", "fwd+bwd", "fwdTF/s");
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> U(-1.0, 1.0);
    for (const Shape &sh : shapes) {
        const int B = sh.B, H = sh.H, T = sh.T, D = sh.D, dt = sh.dt;
        DT q = make(dt, B, H, T, D, nullptr, 0), k = make(dt, B, H, T, D, nullptr, 0), v = make(dt, B, H, T, D, nullptr, 0),
           o = make(dt, B, H, T, D, nullptr, 0), dout = make(dt, B, H, T, D, nullptr, 0), dq = make(dt, B, H, T, D, nullptr, 0),
           dk = make(dt, B, H, T, D, nullptr, 0), dv = make(dt, B, H, T, D, nullptr, 0);
        DT lse = make(dt == EM_F64 ? EM_F64 : EM_F32, 1, B, H, T, nullptr, 0);
        lse.ndim = 3;
        std::vector<double> hv((size_t)B * H * T * D);
        for (DT *t : {&q, &k, &v, &dout}) {
            for (auto &x : hv) x = U(rng);
            upload(*t, hv);
        }
        em_kargs ka;
        memset(&ka, 0, sizeof ka);
        ka.kind = EM_OP_SDPA;
        ka.p.attn.scale = 1.0 / std::sqrt((double)D);
        ka.p.attn.dropout_p = sh.p;
        ka.p.attn.seed = 1;
        ka.p.attn.is_causal = 1;
        ka.n_in = 3;
        ka.n_out = 2;
        ka.in[0] = q.desc(); ka.in[1] = k.desc(); ka.in[2] = v.desc();
        ka.out[0] = o.desc(); ka.out[1] = lse.desc();
        void *pf[8] = {q.dev, k.dev, v.dev, o.dev, lse.dev};
        em_kargs kb = ka;
        kb.kind = EM_OP_SDPA_BWD;
        kb.n_in = 6;
        kb.n_out = 3;
        kb.in[0] = dout.desc(); kb.in[1] = q.desc(); kb.in[2] = k.desc(); kb.in[3] = v.desc(); kb.in[4] = o.desc();
        kb.in[5] = lse.desc();
        kb.out[0] = dq.desc(); kb.out[1] = dk.desc(); kb.out[2] = dv.desc();
        void *pb[10] = {dout.dev, q.dev, k.dev, v.dev, o.dev, lse.dev, dq.dev, dk.dev, dv.dev};
        cudaEvent_t e0, e1, e2;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventCreate(&e2));
        std::vector<float> vf, vb, vt;
        for (int it = 0; it < 23; it++) {
            CK(cudaEventRecord(e0, 0));
            emc::attention_launch(&ka, pf, 0);
            CK(cudaEventRecord(e1, 0));
            emc::attention_launch(&kb, pb, 0);
            CK(cudaEventRecord(e2, 0));
            CK(cudaEventSynchronize(e2));
            float a, b;
            CK(cudaEventElapsedTime(&a, e0, e1));
            CK(cudaEventElapsedTime(&b, e1, e2));
            if (it >= 3) {
                vf.push_back(a);
                vb.push_back(b);
                vt.push_back(a + b);
            }
        }
        auto med = [](std::vector<float> x) { std::sort(x.begin(), x.end()); return x[x.size() / 2]; };
        const double flops = 4.0 * B * H * (double)T * T * D * 0.5;
        char key[64];
        snprintf(key, sizeof key, "B%d_H%d_T%d_D%d_%s_p%.1f", B, H, T, D, dtname(dt), sh.p);
        printf("%-28s %9.3f %9.3f %9.3f %8.2f\n", key, med(vf), med(vb), med(vt), flops / (med(vf) * 1e-3) / 1e12);
        if (tf) fprintf(tf, "%s %.4f %.4f %.4f\n", key, med(vf), med(vb), med(vt));
        DT *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv, &lse};
        for (DT *t : all) release(*t);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaEventDestroy(e2);
    }
    if (g_cuda_errors) printf("CUDA errors during timing: %d\n", g_cuda_errors);
}

int main(int argc, char **argv)
{
    bool do_test = true, do_bench = true;
    const char *times = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-test")) do_test = false;
        else if (!strcmp(argv[i], "--no-bench")) do_bench = false;
        else if (!strcmp(argv[i], "--times") && i + 1 < argc) times = argv[++i];
    }
    setvbuf(stdout, nullptr, _IOLBF, 0); /* lines in order with stderr's */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    if (do_test) {
        tests();
        printf("\nTOTAL: %d PASS, %d FAIL\n", g_pass, g_fail);
    }
    if (do_bench) {
        FILE *tf = times ? fopen(times, "w") : nullptr;
        bench(tf);
        if (tf) fclose(tf);
    }
    return g_fail || g_cuda_errors ? 1 : 0;
}
