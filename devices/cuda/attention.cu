/* CUDA kernels of the attention family: the fused scaled-dot-product
 * attention SDPA (forward) and SDPA_BWD (backward). The kernel contract
 * (shapes, strides, dropout counters, masked rows) is the one shared by every
 * backend (sdpa contract: tasks/ops.def SDPA / SDPA_BWD, devices/kargs.h attn).
 *
 * Algorithm: FlashAttention (Dao et al. 2022) forward with the online
 * softmax of Milakov & Gimelshein (2018), and the FlashAttention-2 backward
 * (Dao 2023, Algorithm 2), written from the papers' formulas:
 *
 *   forward, one block per (query tile of BQ rows, h, b): the Q tile is staged
 *     in shared memory, then for each key tile of BK keys (tiles entirely
 *     above the causal diagonal are skipped) K and V are staged, S = scale *
 *     Q K^T (+ mask, causal -inf) is computed in registers, the running row
 *     max m and the running sum l (f32, f64 for f64) are updated, the
 *     accumulator O (registers) is rescaled by exp(m_old - m_new), P * Z
 *     (dropout keep mask, the contract's philox counter per (b, h, i, j)) goes
 *     to shared memory and O += (P * Z) V. At the end o = O / l and
 *     lse = m + log(l). A row with every key masked gets lse = -inf and
 *     o = 0 / 0 = NaN (the contract). Never a Tq x Tk buffer in memory.
 *   backward, two kernels, no atomics (deterministic), no workspace:
 *     - dK/dV: one block per (key tile, h, b); K, V tiles stay in shared
 *       memory, the kernel loops over the query tiles that can see the keys
 *       (causal: from the diagonal on), recomputes S^T and P^T = exp(S^T -
 *       lse), delta_i = dout_i . o_i (computed on the fly from the staged
 *       dout tile and o, so no preprocessing pass and no workspace),
 *       dP^T = Z * (V dout^T), dS^T = P^T (dP^T - delta), and accumulates
 *       dV += (P Z)^T dout, dK += dS^T Q in registers; dK is scaled at the end.
 *     - dQ: one block per (query tile, h, b), the forward's loop over key
 *       tiles: recomputes P and dP, dQ += dS K, times scale.
 *     Rows with lse = -inf are skipped (their p is taken as 0). The dQ kernel
 *     recomputes S and dP (7 tile products per key/query tile pair instead
 *     of FA2's 5 with atomics) to stay deterministic and workspace-free.
 *
 * Tiling: 256 threads as a 16 x 16 grid (ty, tx); a thread owns the tile rows
 * ty + 16 i (i < RM) and the columns tx + 16 j, so a row's reductions are
 * shuffles within 16 lanes of one warp. Tiles live in shared memory as A
 * (the compute type: float, or double for f64), row-major. The tile products
 * (mm_abt: S = Q K^T, dP = dO V^T; mm_ab: O += P V, dV, dK, dQ) read 4
 * consecutive elements per load for float (rows padded to DM + 4; a thread's
 * output columns are then 64 g + 4 tx + e) and scalars for double (rows
 * padded to DM + 1, columns tx + 16 j); Cfg says which, and the unroll count,
 * chosen by timing. DM = the head-dim bucket max(D, Dv) <= 64, <= 128,
 * <= 256 (template fast paths; any D, Dv in [1, 256]: tiles are zero-filled
 * past D, Dv, Tq, Tk). Dynamic shared memory up to 209 KB per block (set per
 * launch with cudaFuncSetAttribute): sm_90 (H100 / H200, 227 KB per block);
 * on a GPU with less, the larger buckets fail with a launch error reported
 * through check(), never silently. Registers capped for 2 blocks per SM
 * where 2 blocks' shared memory fits.
 *
 * Dtypes: f32, f16, bf16 load T, compute in f32 (lse f32), store T; f64
 * computes in f64 (lse f64). CUDA cores only (no tensor cores yet).
 * Exponentials: __expf for float, exp for double.
 *
 * Limits: q, k, v, o, dout, dq, dk, dv unit last stride (shape 1 allowed);
 * any other strides, 64-bit offsets; mask any strides (0 = broadcast);
 * H, B <= 65535 (grid y, z); D, Dv in [1, 256]. Everything is queued on the
 * given stream; nothing waits, nothing is allocated. */
#include "devices/cuda/emcuda.h"
#include "devices/cuda/half.cuh"
#include "devices/philox.h"

#include <math.h>
#include <type_traits>

using namespace emc;

namespace {

constexpr int kAT = 256; /* threads per block, 16 x 16 */

/* Row padding of the shared tiles: 4-wide loads need rows of a multiple of 4
 * elements; scalar loads are conflict-free with rows of odd length. */
__host__ __device__ constexpr int pad_of(bool vec) { return vec ? 4 : 1; }

struct S3 {
    int64_t b, h, t; /* strides of dims 0..2; the last one is 1 */
};

struct Args {
    const void *q, *k, *v, *mask, *dout;
    void *o, *lse; /* forward: outputs; backward: inputs */
    void *dq, *dk, *dv;
    S3 sq, sk, sv, so, sdo, slse, sdq, sdk, sdv;
    int64_t sm[4];
    int B, H, Tq, Tk, D, Dv;
    double scale, rp; /* rp = 1 / (1 - dropout_p) (0 when p = 1) */
    uint64_t seed, offset;
    uint32_t thr; /* keep iff (philox w[0] >> 8) >= thr, i.e. u01 >= p */
    int dropout, causal, has_mask;
    bool bf;
};

/* Load / store of one storage type, compute type A. */
template <typename T> struct Cvt;
template <> struct Cvt<float> {
    typedef float A;
    __device__ static float ld(const float *p, int64_t i, bool) { return p[i]; }
    __device__ static void st(float *p, int64_t i, float v, bool) { p[i] = v; }
};
template <> struct Cvt<double> {
    typedef double A;
    __device__ static double ld(const double *p, int64_t i, bool) { return p[i]; }
    __device__ static void st(double *p, int64_t i, double v, bool) { p[i] = v; }
};
template <> struct Cvt<uint16_t> {
    typedef float A;
    __device__ static float ld(const uint16_t *p, int64_t i, bool bf) { return H16{bf}.ld(p[i]); }
    __device__ static void st(uint16_t *p, int64_t i, float v, bool bf) { p[i] = H16{bf}.st(v); }
};

__device__ __forceinline__ float ex(float x) { return __expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float lg(float x) { return logf(x); }
__device__ __forceinline__ double lg(double x) { return log(x); }
template <typename A> __device__ __forceinline__ A ninf() { return -(A)INFINITY; }

/* Reductions over the 16 lanes of one tile row (lanes tx = 0..15 of a half warp). */
template <typename A> __device__ __forceinline__ A row_max(A x)
{
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
template <typename A> __device__ __forceinline__ A row_sum(A x)
{
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Dropout keep bit of element (bh, i, j): the contract's counter. */
__device__ __forceinline__ bool keep_elem(const Args &a, int64_t bh, int i, int j)
{
    const uint64_t e = ((uint64_t)bh * (uint64_t)a.Tq + (uint64_t)i) * (uint64_t)a.Tk + (uint64_t)j;
    uint32_t w[4];
    em_philox4x32_10(a.offset + e, a.seed, w);
    return (w[0] >> 8) >= a.thr;
}

/* Stages rows [r0, r0 + ROWS) x cols [0, DM) of a [n, ncols] row-major (row
 * stride st) operand into s (row length DM + PAD), zeros outside. */
template <typename T, int ROWS, int DM, int PAD>
__device__ __forceinline__ void load_tile(typename Cvt<T>::A *s, const T *g, int64_t st, int r0, int nrows, int ncols,
                                          bool bf)
{
    typedef typename Cvt<T>::A A;
    constexpr int LD = DM + PAD;
    for (int e = threadIdx.x; e < ROWS * DM; e += kAT) {
        const int r = e / DM, d = e - r * DM;
        A v = 0;
        if (r0 + r < nrows && d < ncols) v = Cvt<T>::ld(g, (int64_t)(r0 + r) * st + d, bf);
        s[r * LD + d] = v;
    }
}

/* Four consecutive elements of a shared-memory row (16-byte aligned). */
template <typename A> __device__ __forceinline__ void ld4(const A *p, A v[4])
{
    if constexpr (std::is_same<A, float>::value) {
        const float4 t = *reinterpret_cast<const float4 *>(p);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
        const double2 t = reinterpret_cast<const double2 *>(p)[0], u = reinterpret_cast<const double2 *>(p)[1];
        v[0] = t.x; v[1] = t.y; v[2] = u.x; v[3] = u.y;
    }
}

/* acc[i][j] += sum_{d < n} As[(ty + 16 i) * LDA + d] * Bs[(tx + 16 j) * LDB + d]:
 * a tile of A B^T, both row-major in shared memory; VEC reads 4 columns at a
 * time (n rounded up to 4: the tiles are zero there). */
template <typename A, int RM, int CN, int LDA, int LDB, bool VEC, int UNR>
__device__ __forceinline__ void mm_abt(A (&acc)[RM][CN], const A *As, const A *Bs, int ty, int tx, int n)
{
    if constexpr (VEC) {
#pragma unroll UNR
        for (int d = 0; d < n; d += 4) {
            A a[RM][4], b[CN][4];
#pragma unroll
            for (int i = 0; i < RM; i++) ld4(As + (ty + 16 * i) * LDA + d, a[i]);
#pragma unroll
            for (int j = 0; j < CN; j++) ld4(Bs + (tx + 16 * j) * LDB + d, b[j]);
#pragma unroll
            for (int e = 0; e < 4; e++)
#pragma unroll
                for (int i = 0; i < RM; i++)
#pragma unroll
                    for (int j = 0; j < CN; j++) acc[i][j] = fma(a[i][e], b[j][e], acc[i][j]);
        }
    } else {
#pragma unroll UNR
        for (int d = 0; d < n; d++) {
            A a[RM], b[CN];
#pragma unroll
            for (int i = 0; i < RM; i++) a[i] = As[(ty + 16 * i) * LDA + d];
#pragma unroll
            for (int j = 0; j < CN; j++) b[j] = Bs[(tx + 16 * j) * LDB + d];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < CN; j++) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
    }
}

/* acc[i][n'] += sum_{c < n} Ps[(ty + 16 i) * LDP + c] * Vs[c * LDV + out_col(n')]:
 * a tile of P V, the thread's NC output columns out_col<VEC>(n', tx). */
template <bool VEC> __device__ __forceinline__ int out_col(int n, int tx)
{
    return VEC ? 64 * (n >> 2) + 4 * tx + (n & 3) : tx + 16 * n;
}
template <typename A, int RM, int NC, int LDP, int LDV, bool VEC, int UNR>
__device__ __forceinline__ void mm_ab(A (&acc)[RM][NC], const A *Ps, const A *Vs, int ty, int tx, int n)
{
    if constexpr (VEC) {
        constexpr int G = NC / 4;
#pragma unroll UNR
        for (int c = 0; c < n; c += 4) {
            A p[RM][4];
#pragma unroll
            for (int i = 0; i < RM; i++) ld4(Ps + (ty + 16 * i) * LDP + c, p[i]);
#pragma unroll
            for (int e2 = 0; e2 < 4; e2++) {
                A v[G][4];
#pragma unroll
                for (int g = 0; g < G; g++) ld4(Vs + (c + e2) * LDV + 64 * g + 4 * tx, v[g]);
#pragma unroll
                for (int i = 0; i < RM; i++)
#pragma unroll
                    for (int g = 0; g < G; g++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i][4 * g + e] = fma(p[i][e2], v[g][e], acc[i][4 * g + e]);
            }
        }
    } else {
#pragma unroll UNR
        for (int c = 0; c < n; c++) {
            A p[RM], v[NC];
#pragma unroll
            for (int i = 0; i < RM; i++) p[i] = Ps[(ty + 16 * i) * LDP + c];
#pragma unroll
            for (int m = 0; m < NC; m++) v[m] = Vs[c * LDV + tx + 16 * m];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int m = 0; m < NC; m++) acc[i][m] = fma(p[i], v[m], acc[i][m]);
        }
    }
}

/* Tile shapes per compute type and head-dim bucket: forward / dQ rows RM,
 * key columns CN (BQ = 16 RM, BK = 16 CN); dK/dV key rows RK, query columns
 * CQ. VEC: 4-wide shared-memory loads in the tile products (else scalar);
 * UNR: unroll count of the product loops. VEC / UNR are the fastest of the
 * variants timed on an H200 (bench/attention_harness.cu, 2026-12-02; every
 * variant passed the whole test list): float D <= 64: VEC, UNR 2 (T = 4096
 * causal fwd + bwd 40 ms against 47 for UNR 1 and 50 for scalar loads);
 * float D <= 128: VEC, UNR 1 (8.1 ms against 11.3 / 11.9 at T = 1024);
 * double: scalar, UNR 4 (6.9 ms against 10.0 at T = 1024, D = 64). float
 * D <= 256 and double D > 64 were not timed (same rules kept). */
template <typename A, int DM> struct Cfg;
template <> struct Cfg<float, 64> { static constexpr int RM = 4, CN = 4, RK = 4, CQ = 4, UNR = 2; static constexpr bool VEC = true; };
template <> struct Cfg<float, 128> { static constexpr int RM = 4, CN = 4, RK = 4, CQ = 2, UNR = 1; static constexpr bool VEC = true; };
template <> struct Cfg<float, 256> { static constexpr int RM = 4, CN = 2, RK = 2, CQ = 2, UNR = 1; static constexpr bool VEC = true; };
template <> struct Cfg<double, 64> { static constexpr int RM = 4, CN = 2, RK = 2, CQ = 2, UNR = 4; static constexpr bool VEC = false; };
template <> struct Cfg<double, 128> { static constexpr int RM = 2, CN = 2, RK = 2, CQ = 2, UNR = 4; static constexpr bool VEC = false; };
template <> struct Cfg<double, 256> { static constexpr int RM = 2, CN = 1, RK = 2, CQ = 1, UNR = 4; static constexpr bool VEC = false; };

template <typename A, int DM, int RM, int CN, int PAD = pad_of(Cfg<A, DM>::VEC)> constexpr size_t fwd_smem()
{
    return sizeof(A) * ((size_t)16 * RM * (DM + PAD) + 2 * (size_t)16 * CN * (DM + PAD) + (size_t)16 * RM * (16 * CN + PAD));
}
template <typename A, int DM, int RM, int CN, int PAD = pad_of(Cfg<A, DM>::VEC)> constexpr size_t dq_smem()
{
    return sizeof(A) * (2 * (size_t)16 * RM * (DM + PAD) + 2 * (size_t)16 * CN * (DM + PAD) + (size_t)16 * RM * (16 * CN + PAD));
}
template <typename A, int DM, int RK, int CQ, int PAD = pad_of(Cfg<A, DM>::VEC)> constexpr size_t dkv_smem()
{
    return sizeof(A) * (2 * (size_t)16 * RK * (DM + PAD) + 2 * (size_t)16 * CQ * (DM + PAD) +
                        2 * (size_t)16 * RK * (16 * CQ + PAD) + 2 * (size_t)16 * CQ);
}

/* Blocks per SM the registers are capped for: 2 when two blocks' shared
 * memory fits an SM (H100/H200: 227 KB per block, 228 KB per SM), else 1. */
constexpr int min_blocks(size_t smem) { return 2 * (smem + 1024) <= (size_t)228 * 1024 ? 2 : 1; }

/* ---- forward ------------------------------------------------------------- */

template <typename T, int DM, int RM, int CN>
__global__ void __launch_bounds__(kAT, min_blocks(fwd_smem<typename Cvt<T>::A, DM, RM, CN>())) k_fwd(Args a)
{
    typedef typename Cvt<T>::A A;
    constexpr bool VEC = Cfg<A, DM>::VEC;
    constexpr int UNR = Cfg<A, DM>::UNR;
    constexpr int PAD = pad_of(VEC), BQ = 16 * RM, BK = 16 * CN, LD = DM + PAD, LP = BK + PAD, NC = DM / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *Qs = (A *)smem_raw, *Ks = Qs + BQ * LD, *Vs = Ks + BK * LD, *Ps = Vs + BK * LD;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BQ; /* the longest causal rows first */
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t bh = (int64_t)b * a.H + h;
    const T *q = (const T *)a.q + b * a.sq.b + h * a.sq.h;
    const T *k = (const T *)a.k + b * a.sk.b + h * a.sk.h;
    const T *v = (const T *)a.v + b * a.sv.b + h * a.sv.h;
    const T *mask = a.has_mask ? (const T *)a.mask + b * a.sm[0] + h * a.sm[1] : nullptr;
    const A scale = (A)a.scale, rp = (A)a.rp;

    load_tile<T, BQ, DM, PAD>(Qs, q, a.sq.t, q0, a.Tq, a.D, a.bf);
    A m[RM], l[RM], acc[RM][NC];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        m[i] = ninf<A>();
        l[i] = 0;
#pragma unroll
        for (int n = 0; n < NC; n++) acc[i][n] = 0;
    }
    int kend = a.Tk;
    if (a.causal && q0 + BQ < kend) kend = q0 + BQ;
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        load_tile<T, BK, DM, PAD>(Ks, k, a.sk.t, k0, a.Tk, a.D, a.bf);
        load_tile<T, BK, DM, PAD>(Vs, v, a.sv.t, k0, a.Tk, a.Dv, a.bf);
        __syncthreads();
        A s[RM][CN];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < CN; j++) s[i][j] = 0;
        mm_abt<A, RM, CN, LD, LD, VEC, UNR>(s, Qs, Ks, ty, tx, a.D);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int r = q0 + ty + 16 * i;
            A mx = ninf<A>();
#pragma unroll
            for (int j = 0; j < CN; j++) {
                const int c = k0 + tx + 16 * j;
                A x = s[i][j] * scale;
                if (mask && r < a.Tq && c < a.Tk) x += Cvt<T>::ld(mask, (int64_t)r * a.sm[2] + (int64_t)c * a.sm[3], a.bf);
                if (c >= a.Tk || (a.causal && c > r)) x = ninf<A>();
                s[i][j] = x;
                mx = fmax(mx, x);
            }
            mx = row_max(mx);
            const A mn = fmax(m[i], mx), ms = mn == ninf<A>() ? (A)0 : mn;
            const A alpha = ex(m[i] - ms);
            m[i] = mn;
            A ps = 0;
#pragma unroll
            for (int j = 0; j < CN; j++) {
                A p = ex(s[i][j] - ms);
                ps += p;
                if (a.dropout) p = (p != (A)0 && keep_elem(a, bh, r, k0 + tx + 16 * j)) ? p * rp : (A)0;
                Ps[(ty + 16 * i) * LP + tx + 16 * j] = p;
            }
            l[i] = l[i] * alpha + ps; /* this thread's share; summed over the row at the end */
#pragma unroll
            for (int n = 0; n < NC; n++) acc[i][n] *= alpha;
        }
        __syncthreads();
        const int cmax = a.Tk - k0 < BK ? a.Tk - k0 : BK;
        mm_ab<A, RM, NC, LP, LD, VEC, UNR>(acc, Ps, Vs, ty, tx, cmax);
    }
    T *o = (T *)a.o + b * a.so.b + h * a.so.h;
    A *lse = (A *)a.lse + b * a.slse.b + h * a.slse.h;
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const A li = row_sum(l[i]);
        const int r = q0 + ty + 16 * i;
        if (r >= a.Tq) continue;
        const A inv = (A)1 / li; /* l = 0 (all masked): inf, and o = 0 * inf = NaN */
#pragma unroll
        for (int n = 0; n < NC; n++) {
            const int col = out_col<VEC>(n, tx);
            if (col < a.Dv) Cvt<T>::st(o, (int64_t)r * a.so.t + col, acc[i][n] * inv, a.bf);
        }
        if (tx == 0) lse[(int64_t)r * a.slse.t] = m[i] + lg(li);
    }
}

/* ---- backward: dK, dV per key tile ------------------------------------------ */

template <typename T, int DM, int RK, int CQ>
__global__ void __launch_bounds__(kAT, min_blocks(dkv_smem<typename Cvt<T>::A, DM, RK, CQ>())) k_dkv(Args a)
{
    typedef typename Cvt<T>::A A;
    constexpr bool VEC = Cfg<A, DM>::VEC;
    constexpr int UNR = Cfg<A, DM>::UNR;
    constexpr int PAD = pad_of(VEC), BK = 16 * RK, BQ = 16 * CQ, LD = DM + PAD, LP = BQ + PAD, NC = DM / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *Ks = (A *)smem_raw, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *Os = Qs + BQ * LD, *Ps = Os + BQ * LD;
    A *Ds = Ps + BK * LP, *Ls = Ds + BK * LP, *Dl = Ls + BQ;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int k0 = blockIdx.x * BK;
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t bh = (int64_t)b * a.H + h;
    const T *q = (const T *)a.q + b * a.sq.b + h * a.sq.h;
    const T *k = (const T *)a.k + b * a.sk.b + h * a.sk.h;
    const T *v = (const T *)a.v + b * a.sv.b + h * a.sv.h;
    const T *o = (const T *)a.o + b * a.so.b + h * a.so.h;
    const T *dout = (const T *)a.dout + b * a.sdo.b + h * a.sdo.h;
    const A *lse = (const A *)a.lse + b * a.slse.b + h * a.slse.h;
    const T *mask = a.has_mask ? (const T *)a.mask + b * a.sm[0] + h * a.sm[1] : nullptr;
    const A scale = (A)a.scale, rp = (A)a.rp;

    load_tile<T, BK, DM, PAD>(Ks, k, a.sk.t, k0, a.Tk, a.D, a.bf);
    load_tile<T, BK, DM, PAD>(Vs, v, a.sv.t, k0, a.Tk, a.Dv, a.bf);
    A dk[RK][NC], dv[RK][NC];
#pragma unroll
    for (int i = 0; i < RK; i++)
#pragma unroll
        for (int n = 0; n < NC; n++) dk[i][n] = dv[i][n] = 0;
    const int qstart = a.causal ? (k0 / BQ) * BQ : 0;
    for (int q0 = qstart; q0 < a.Tq; q0 += BQ) {
        __syncthreads();
        load_tile<T, BQ, DM, PAD>(Qs, q, a.sq.t, q0, a.Tq, a.D, a.bf);
        load_tile<T, BQ, DM, PAD>(Os, dout, a.sdo.t, q0, a.Tq, a.Dv, a.bf);
        __syncthreads();
        for (int rr = ty; rr < BQ; rr += 16) { /* delta = rowsum(dout * o), lse of the tile's rows */
            const int r = q0 + rr;
            A part = 0;
            if (r < a.Tq)
                for (int n = tx; n < a.Dv; n += 16) part = fma(Os[rr * LD + n], Cvt<T>::ld(o, (int64_t)r * a.so.t + n, a.bf), part);
            part = row_sum(part);
            if (tx == 0) {
                Dl[rr] = part;
                Ls[rr] = r < a.Tq ? lse[(int64_t)r * a.slse.t] : ninf<A>();
            }
        }
        __syncthreads();
        A s[RK][CQ], dp[RK][CQ];
#pragma unroll
        for (int i = 0; i < RK; i++)
#pragma unroll
            for (int j = 0; j < CQ; j++) s[i][j] = dp[i][j] = 0;
        mm_abt<A, RK, CQ, LD, LD, VEC, UNR>(s, Ks, Qs, ty, tx, a.D);
        mm_abt<A, RK, CQ, LD, LD, VEC, UNR>(dp, Vs, Os, ty, tx, a.Dv);
#pragma unroll
        for (int i = 0; i < RK; i++) {
            const int c = k0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < CQ; j++) {
                const int rr = tx + 16 * j, r = q0 + rr;
                const A L = Ls[rr];
                A p = 0;
                if (L != ninf<A>() && c < a.Tk && !(a.causal && c > r)) {
                    A x = s[i][j] * scale;
                    if (mask) x += Cvt<T>::ld(mask, (int64_t)r * a.sm[2] + (int64_t)c * a.sm[3], a.bf);
                    p = ex(x - L);
                }
                A z = 1;
                if (a.dropout) z = (p != (A)0 && keep_elem(a, bh, r, c)) ? rp : (A)0;
                Ps[(ty + 16 * i) * LP + rr] = p * z;
                Ds[(ty + 16 * i) * LP + rr] = p != (A)0 ? p * (dp[i][j] * z - Dl[rr]) : (A)0;
            }
        }
        __syncthreads();
        const int rmax = a.Tq - q0 < BQ ? a.Tq - q0 : BQ;
        mm_ab<A, RK, NC, LP, LD, VEC, UNR>(dv, Ps, Os, ty, tx, rmax);
        mm_ab<A, RK, NC, LP, LD, VEC, UNR>(dk, Ds, Qs, ty, tx, rmax);
    }
    T *gdk = (T *)a.dk + b * a.sdk.b + h * a.sdk.h;
    T *gdv = (T *)a.dv + b * a.sdv.b + h * a.sdv.h;
#pragma unroll
    for (int i = 0; i < RK; i++) {
        const int c = k0 + ty + 16 * i;
        if (c >= a.Tk) continue;
#pragma unroll
        for (int n = 0; n < NC; n++) {
            const int col = out_col<VEC>(n, tx);
            if (col < a.D) Cvt<T>::st(gdk, (int64_t)c * a.sdk.t + col, dk[i][n] * scale, a.bf);
            if (col < a.Dv) Cvt<T>::st(gdv, (int64_t)c * a.sdv.t + col, dv[i][n], a.bf);
        }
    }
}

/* ---- backward: dQ per query tile --------------------------------------------- */

template <typename T, int DM, int RM, int CN>
__global__ void __launch_bounds__(kAT, min_blocks(dq_smem<typename Cvt<T>::A, DM, RM, CN>())) k_dq(Args a)
{
    typedef typename Cvt<T>::A A;
    constexpr bool VEC = Cfg<A, DM>::VEC;
    constexpr int UNR = Cfg<A, DM>::UNR;
    constexpr int PAD = pad_of(VEC), BQ = 16 * RM, BK = 16 * CN, LD = DM + PAD, LP = BK + PAD, NC = DM / 16;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A *Qs = (A *)smem_raw, *Os = Qs + BQ * LD, *Ks = Os + BQ * LD, *Vs = Ks + BK * LD, *Ds = Vs + BK * LD;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * BQ;
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t bh = (int64_t)b * a.H + h;
    const T *q = (const T *)a.q + b * a.sq.b + h * a.sq.h;
    const T *k = (const T *)a.k + b * a.sk.b + h * a.sk.h;
    const T *v = (const T *)a.v + b * a.sv.b + h * a.sv.h;
    const T *o = (const T *)a.o + b * a.so.b + h * a.so.h;
    const T *dout = (const T *)a.dout + b * a.sdo.b + h * a.sdo.h;
    const A *lse = (const A *)a.lse + b * a.slse.b + h * a.slse.h;
    const T *mask = a.has_mask ? (const T *)a.mask + b * a.sm[0] + h * a.sm[1] : nullptr;
    const A scale = (A)a.scale, rp = (A)a.rp;

    load_tile<T, BQ, DM, PAD>(Qs, q, a.sq.t, q0, a.Tq, a.D, a.bf);
    load_tile<T, BQ, DM, PAD>(Os, dout, a.sdo.t, q0, a.Tq, a.Dv, a.bf);
    __syncthreads();
    A Li[RM], Dli[RM], acc[RM][NC];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int rr = ty + 16 * i, r = q0 + rr;
        A part = 0;
        if (r < a.Tq)
            for (int n = tx; n < a.Dv; n += 16) part = fma(Os[rr * LD + n], Cvt<T>::ld(o, (int64_t)r * a.so.t + n, a.bf), part);
        Dli[i] = row_sum(part);
        Li[i] = r < a.Tq ? lse[(int64_t)r * a.slse.t] : ninf<A>();
#pragma unroll
        for (int n = 0; n < NC; n++) acc[i][n] = 0;
    }
    int kend = a.Tk;
    if (a.causal && q0 + BQ < kend) kend = q0 + BQ;
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        load_tile<T, BK, DM, PAD>(Ks, k, a.sk.t, k0, a.Tk, a.D, a.bf);
        load_tile<T, BK, DM, PAD>(Vs, v, a.sv.t, k0, a.Tk, a.Dv, a.bf);
        __syncthreads();
        A s[RM][CN], dp[RM][CN];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < CN; j++) s[i][j] = dp[i][j] = 0;
        mm_abt<A, RM, CN, LD, LD, VEC, UNR>(s, Qs, Ks, ty, tx, a.D);
        mm_abt<A, RM, CN, LD, LD, VEC, UNR>(dp, Os, Vs, ty, tx, a.Dv);
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int r = q0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < CN; j++) {
                const int c = k0 + tx + 16 * j;
                A p = 0;
                if (Li[i] != ninf<A>() && c < a.Tk && !(a.causal && c > r)) {
                    A x = s[i][j] * scale;
                    if (mask) x += Cvt<T>::ld(mask, (int64_t)r * a.sm[2] + (int64_t)c * a.sm[3], a.bf);
                    p = ex(x - Li[i]);
                }
                A z = 1;
                if (a.dropout) z = (p != (A)0 && keep_elem(a, bh, r, c)) ? rp : (A)0;
                Ds[(ty + 16 * i) * LP + tx + 16 * j] = p != (A)0 ? p * (dp[i][j] * z - Dli[i]) : (A)0;
            }
        }
        __syncthreads();
        const int cmax = a.Tk - k0 < BK ? a.Tk - k0 : BK;
        mm_ab<A, RM, NC, LP, LD, VEC, UNR>(acc, Ds, Ks, ty, tx, cmax);
    }
    T *gdq = (T *)a.dq + b * a.sdq.b + h * a.sdq.h;
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int r = q0 + ty + 16 * i;
        if (r >= a.Tq) continue;
#pragma unroll
        for (int n = 0; n < NC; n++) {
            const int col = out_col<VEC>(n, tx);
            if (col < a.D) Cvt<T>::st(gdq, (int64_t)r * a.sdq.t + col, acc[i][n] * scale, a.bf);
        }
    }
}

/* ---- host side --------------------------------------------------------------- */

template <typename KF> void launch_k(KF kern, dim3 grid, size_t smem, cudaStream_t s, const Args &a, const char *what)
{
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        check(e, what);
        return;
    }
    kern<<<grid, kAT, smem, s>>>(a);
    check(cudaGetLastError(), what);
}

template <typename T, int DM> void run_dm(const Args &a, bool fwd, cudaStream_t s)
{
    typedef typename Cvt<T>::A A;
    typedef Cfg<A, DM> C;
    const dim3 gq((unsigned)((a.Tq + 16 * C::RM - 1) / (16 * C::RM)), (unsigned)a.H, (unsigned)a.B);
    if (fwd) {
        launch_k(k_fwd<T, DM, C::RM, C::CN>, gq, fwd_smem<A, DM, C::RM, C::CN>(), s, a, "sdpa (forward)");
        return;
    }
    const dim3 gk((unsigned)((a.Tk + 16 * C::RK - 1) / (16 * C::RK)), (unsigned)a.H, (unsigned)a.B);
    launch_k(k_dkv<T, DM, C::RK, C::CQ>, gk, dkv_smem<A, DM, C::RK, C::CQ>(), s, a, "sdpa_bwd (dk, dv)");
    launch_k(k_dq<T, DM, C::RM, C::CN>, gq, dq_smem<A, DM, C::RM, C::CN>(), s, a, "sdpa_bwd (dq)");
}

template <typename T> void run_t(const Args &a, bool fwd, cudaStream_t s)
{
    const int dm = a.D > a.Dv ? a.D : a.Dv;
    if (dm <= 64)
        run_dm<T, 64>(a, fwd, s);
    else if (dm <= 128)
        run_dm<T, 128>(a, fwd, s);
    else
        run_dm<T, 256>(a, fwd, s);
}

/* A [B, H, T, X] descriptor of dtype dt with unit last stride (or X = 1). */
bool desc4(const em_tdesc &d, int dt, int64_t B, int64_t H, int64_t T, int64_t X, S3 *st)
{
    if (d.dtype != dt || d.ndim != 4 || d.shape[0] != B || d.shape[1] != H || d.shape[2] != T || d.shape[3] != X) return false;
    if (X > 1 && d.strides[3] != 1) return false;
    st->b = d.strides[0];
    st->h = d.strides[1];
    st->t = d.strides[2];
    return true;
}

} // namespace

namespace emc {

void attention_launch(const em_kargs *k, void *const *ptrs, cudaStream_t s)
{
    const bool fwd = k->kind == EM_OP_SDPA;
    if (!fwd && k->kind != EM_OP_SDPA_BWD) {
        unsupported("attention", k->kind);
        return;
    }
    const int has_mask = k->p.attn.has_mask != 0;
    const int nq = fwd ? 0 : 1; /* index of q among the inputs */
    if (k->n_in != (fwd ? 3 : 6) + has_mask || k->n_out != (fwd ? 2 : 3)) {
        unsupported(fwd ? "sdpa: operand count" : "sdpa_bwd: operand count", k->kind);
        return;
    }
    const em_tdesc &dq = k->in[nq], &dkd = k->in[nq + 1], &dvd = k->in[nq + 2];
    const int dt = dq.dtype;
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16) {
        unsupported("attention: dtype", dt);
        return;
    }
    if (dq.ndim != 4 || dkd.ndim != 4 || dvd.ndim != 4) {
        unsupported("attention: operands are not 4-D", k->kind);
        return;
    }
    const int64_t B = dq.shape[0], H = dq.shape[1], Tq = dq.shape[2], D = dq.shape[3];
    const int64_t Tk = dkd.shape[2], Dv = dvd.shape[3];
    Args a = {};
    const int lse_dt = dt == EM_F64 ? EM_F64 : EM_F32;
    bool ok = D >= 1 && D <= 256 && Dv >= 1 && Dv <= 256 && Tq >= 1 && Tk >= 1 && Tq < INT32_MAX && Tk < INT32_MAX &&
              B >= 0 && B <= 65535 && H >= 0 && H <= 65535;
    ok = ok && desc4(dq, dt, B, H, Tq, D, &a.sq) && desc4(dkd, dt, B, H, Tk, D, &a.sk) && desc4(dvd, dt, B, H, Tk, Dv, &a.sv);
    const em_tdesc *mk = has_mask ? &k->in[fwd ? 3 : 6] : nullptr;
    if (ok && mk) {
        ok = mk->dtype == dt && mk->ndim == 4 && mk->shape[0] == B && mk->shape[1] == H && mk->shape[2] == Tq && mk->shape[3] == Tk;
        for (int i = 0; i < 4; i++) a.sm[i] = mk->strides[i];
    }
    const em_tdesc *lsed = fwd ? &k->out[1] : &k->in[5];
    ok = ok && lsed->dtype == lse_dt && lsed->ndim == 3 && lsed->shape[0] == B && lsed->shape[1] == H && lsed->shape[2] == Tq;
    if (ok) {
        a.slse.b = lsed->strides[0];
        a.slse.h = lsed->strides[1];
        a.slse.t = lsed->strides[2];
    }
    if (fwd) {
        ok = ok && desc4(k->out[0], dt, B, H, Tq, Dv, &a.so);
        a.q = ptrs[0];
        a.k = ptrs[1];
        a.v = ptrs[2];
        a.mask = has_mask ? ptrs[3] : nullptr;
        a.o = ptrs[k->n_in];
        a.lse = ptrs[k->n_in + 1];
    } else {
        ok = ok && desc4(k->in[0], dt, B, H, Tq, Dv, &a.sdo) && desc4(k->in[4], dt, B, H, Tq, Dv, &a.so) &&
             desc4(k->out[0], dt, B, H, Tq, D, &a.sdq) && desc4(k->out[1], dt, B, H, Tk, D, &a.sdk) &&
             desc4(k->out[2], dt, B, H, Tk, Dv, &a.sdv);
        a.dout = ptrs[0];
        a.q = ptrs[1];
        a.k = ptrs[2];
        a.v = ptrs[3];
        a.o = ptrs[4];
        a.lse = ptrs[5];
        a.mask = has_mask ? ptrs[6] : nullptr;
        a.dq = ptrs[k->n_in];
        a.dk = ptrs[k->n_in + 1];
        a.dv = ptrs[k->n_in + 2];
    }
    const double p = k->p.attn.dropout_p;
    ok = ok && p >= 0.0 && p <= 1.0;
    if (!ok) {
        unsupported(fwd ? "sdpa: operands" : "sdpa_bwd: operands", dt);
        return;
    }
    if (B == 0 || H == 0) return;
    a.B = (int)B;
    a.H = (int)H;
    a.Tq = (int)Tq;
    a.Tk = (int)Tk;
    a.D = (int)D;
    a.Dv = (int)Dv;
    a.scale = k->p.attn.scale;
    a.dropout = p > 0.0;
    a.rp = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    a.thr = p <= 0.0 ? 0u : p >= 1.0 ? (1u << 24) : (uint32_t)ceil(p * 16777216.0); /* u01 = (w >> 8) / 2^24 >= p */
    a.seed = k->p.attn.seed;
    a.offset = k->p.attn.offset;
    a.causal = k->p.attn.is_causal != 0;
    a.has_mask = has_mask;
    a.bf = dt == EM_BF16;
    switch (dt) {
    case EM_F32: run_t<float>(a, fwd, s); break;
    case EM_F64: run_t<double>(a, fwd, s); break;
    default: run_t<uint16_t>(a, fwd, s); break;
    }
}

} // namespace emc

void em_cuda_attention(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    if (k->n_in < 0 || k->n_in > EM_KARGS_MAX_IN || k->n_out < 0 || k->n_out > EM_KARGS_MAX_OUT) {
        unsupported("attention: operand count", k->kind);
        return;
    }
    void *ptrs[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in; i++) ptrs[i] = base(buffers, i, k->in[i]);
    for (int i = 0; i < k->n_out; i++) ptrs[k->n_in + i] = base(buffers, k->n_in + i, k->out[i]);
    attention_launch(k, ptrs, stream());
}
