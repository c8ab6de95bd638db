/* OpenCL host function for EM_OP_MATMUL. Operands as for devices/cpu/matmul.c:
 * in[0] A [batch..., M, K], in[1] B [batch..., K, N], out[0] C [batch..., M, N],
 * same rank nd >= 2, one dtype, any strides (broadcast batch dims have stride 0).
 *
 * Two paths:
 *   - CLBlast (when built with EMBER_HAVE_CLBLAST and linked with -lclblast):
 *     f32/f64 products whose matrices have a unit stride in one of their two
 *     dims (the same rule as the CPU's BLAS path), through CLBlast{S,D}gemm or
 *     {S,D}gemmBatched with per-batch offsets. Checked with PoCL 3.1 here:
 *     correct, but its first use compiles CLBlast's kernels (~17 s on 2 cores,
 *     then cached in POCL_CACHE_DIR).
 *   - Ember's own tiled kernel (devices/opencl/matmul.cl) for everything else:
 *     integer dtypes, layouts BLAS cannot take, builds without CLBlast.
 * Measured (512^3 f32 through an Ember task): PoCL on 2 cores, own kernel
 * ~2.5-2.9 GFLOP/s, CLBlast ~5.6 GFLOP/s; NVIDIA H200 through NVIDIA's OpenCL
 * (STARPU_NCUDA=0), own kernel 12.4 TFLOP/s f32 and 9.5 TFLOP/s f64 at 4096^3. */
#include "devices/opencl/opencl.h"

#include <stdlib.h>
#include <string.h>

#ifdef EMBER_HAVE_CLBLAST
#include <clblast_c.h>

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* As blas_view in devices/cpu/matmul.c: row-major NoTrans (ld = row stride)
 * or Trans (ld = column stride). */
static bool blast_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, CLBlastTranspose *tr, size_t *ld)
{
    if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= max64(cols, 1))) {
        *tr = CLBlastTransposeNo;
        *ld = (size_t)(rows <= 1 ? max64(cols, 1) : sr);
    } else if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= max64(rows, 1))) {
        *tr = CLBlastTransposeYes;
        *ld = (size_t)(cols <= 1 ? max64(rows, 1) : sc);
    } else {
        return false;
    }
    return true;
}

/* true when CLBlast took the product (all batches). */
static bool gemm_clblast(em_ocl_ctx *c, void *buffers[], const em_kargs *k, int nb, const int64_t *bshape,
                         int64_t bst[][EM_KARGS_MAX_DIMS], int64_t nbatch)
{
    const em_tdesc *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];
    const int nd = C->ndim, dt = C->dtype;
    const size_t es = em_ocl_dtsize(dt);
    int64_t M = C->shape[nd - 2], N = C->shape[nd - 1], K = A->shape[nd - 1];
    int64_t sam = A->strides[nd - 2], sak = A->strides[nd - 1], sbk = B->strides[nd - 2], sbn = B->strides[nd - 1];
    int64_t scm = C->strides[nd - 2], scn = C->strides[nd - 1];
    if (K == 0) return false; /* the tiled kernel writes the zeros */
    size_t boff[3];
    cl_mem mem[3];
    for (int i = 0; i < 3; i++) {
        boff[i] = STARPU_VECTOR_GET_OFFSET(buffers[i]);
        mem[i] = (cl_mem)STARPU_VECTOR_GET_DEV_HANDLE(buffers[i]);
        if (boff[i] % es) return false;
    }
    size_t eo[3] = {boff[0] / es + (size_t)A->offset, boff[1] / es + (size_t)B->offset, boff[2] / es + (size_t)C->offset};
    int bi[3] = {0, 1, 2}; /* batch-stride rows for (a, b, c) as passed to CLBlast */
    CLBlastTranspose tc, ta, tb;
    size_t ldc, lda, ldb;
    if (!blast_view(M, N, scm, scn, &tc, &ldc)) return false;
    if (tc == CLBlastTransposeYes) {
        /* C^T [N, M] = B^T [N, K] * A^T [K, M] */
        int64_t t;
        t = M, M = N, N = t;
        t = sam, sam = sbn, sbn = t;
        t = sak, sak = sbk, sbk = t;
        t = scm, scm = scn, scn = t;
        cl_mem tm = mem[0];
        mem[0] = mem[1], mem[1] = tm;
        size_t te = eo[0];
        eo[0] = eo[1], eo[1] = te;
        bi[0] = 1, bi[1] = 0;
        if (!blast_view(M, N, scm, scn, &tc, &ldc) || tc != CLBlastTransposeNo) return false;
    }
    if (!blast_view(M, K, sam, sak, &ta, &lda) || !blast_view(K, N, sbk, sbn, &tb, &ldb)) return false;

    cl_command_queue q = c->q;
    CLBlastStatusCode s;
    if (nbatch == 1) {
        if (dt == EM_F32)
            s = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, 1.0f, mem[0], eo[0], lda,
                             mem[1], eo[1], ldb, 0.0f, mem[2], eo[2], ldc, &q, NULL);
        else
            s = CLBlastDgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, 1.0, mem[0], eo[0], lda,
                             mem[1], eo[1], ldb, 0.0, mem[2], eo[2], ldc, &q, NULL);
    } else {
        size_t *off = malloc(sizeof(size_t) * 3 * (size_t)nbatch);
        double *ab = malloc(sizeof(double) * 2 * (size_t)nbatch);
        float *abf = malloc(sizeof(float) * 2 * (size_t)nbatch);
        if (!off || !ab || !abf) {
            free(off), free(ab), free(abf);
            return false;
        }
        int64_t idx[EM_KARGS_MAX_DIMS] = {0}, o[3] = {0, 0, 0};
        for (int64_t b = 0; b < nbatch; b++) {
            for (int i = 0; i < 3; i++) off[(size_t)i * (size_t)nbatch + (size_t)b] = eo[i] + (size_t)o[i];
            ab[b] = 1.0, ab[nbatch + b] = 0.0, abf[b] = 1.0f, abf[nbatch + b] = 0.0f;
            for (int d = nb - 1; d >= 0; d--) {
                if (++idx[d] < bshape[d]) {
                    for (int i = 0; i < 3; i++) o[i] += bst[bi[i]][d];
                    break;
                }
                for (int i = 0; i < 3; i++) o[i] -= bst[bi[i]][d] * (bshape[d] - 1);
                idx[d] = 0;
            }
        }
        const size_t *oa = off, *ob = off + nbatch, *oc = off + 2 * nbatch;
        if (dt == EM_F32)
            s = CLBlastSgemmBatched(CLBlastLayoutRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, abf, mem[0], oa, lda,
                                    mem[1], ob, ldb, abf + nbatch, mem[2], oc, ldc, (size_t)nbatch, &q, NULL);
        else
            s = CLBlastDgemmBatched(CLBlastLayoutRowMajor, ta, tb, (size_t)M, (size_t)N, (size_t)K, ab, mem[0], oa, lda,
                                    mem[1], ob, ldb, ab + nbatch, mem[2], oc, ldc, (size_t)nbatch, &q, NULL);
        free(off), free(ab), free(abf);
    }
    if (s != CLBlastSuccess) {
        em_log_msg(EM_LOG_DEBUG, "opencl matmul: CLBlast returned %d, using the tiled kernel", (int)s);
        return false;
    }
    return true;
}
#endif

void em_ocl_matmul_shutdown(void)
{
#ifdef EMBER_HAVE_CLBLAST
    CLBlastClearCache();
#endif
}

void em_ocl_matmul(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];
    const int nd = C->ndim, dt = C->dtype;
    if (k->kind != EM_OP_MATMUL || nd < 2 || nd > EM_KARGS_MAX_DIMS || A->ndim != nd || B->ndim != nd ||
        A->dtype != dt || B->dtype != dt || dt < EM_F32 || dt > EM_U8) {
        em_ocl_error("matmul: unsupported operands (ranks %d/%d/%d, dtypes %d/%d/%d)", A->ndim, B->ndim, nd, A->dtype,
                     B->dtype, dt);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "matmul")) return;
    static const int kid_of[] = {[EM_F32] = EMK_matmul_f32, [EM_F64] = EMK_matmul_f64, [EM_I32] = EMK_matmul_i32,
                                 [EM_I64] = EMK_matmul_i64, [EM_U8] = EMK_matmul_u8};
    const int kid = kid_of[dt];
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const int64_t M = C->shape[nd - 2], N = C->shape[nd - 1], K = A->shape[nd - 1];
    const int nb = nd - 2;
    int64_t bshape[EM_KARGS_MAX_DIMS], bst[3][EM_KARGS_MAX_DIMS];
    const int64_t *sts[3] = {A->strides, B->strides, C->strides};
    int nbc = em_ocl_collapse(nb, C->shape, 3, sts, bshape, bst);
    int64_t nbatch = 1;
    for (int d = 0; d < nb; d++) nbatch *= C->shape[d];
    if (nbatch == 0 || M == 0 || N == 0) return;
#ifdef EMBER_HAVE_CLBLAST
    if ((dt == EM_F32 || dt == EM_F64) && gemm_clblast(&c, buffers, k, nbc, bshape, bst, nbatch)) return;
#endif
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    em_ocl_arg_buf(&a, buffers[0]);
    em_ocl_arg_i64(&a, A->offset);
    em_ocl_arg_buf(&a, buffers[1]);
    em_ocl_arg_i64(&a, B->offset);
    em_ocl_arg_buf(&a, buffers[2]);
    em_ocl_arg_i64(&a, C->offset);
    em_ocl_arg_i64(&a, M);
    em_ocl_arg_i64(&a, N);
    em_ocl_arg_i64(&a, K);
    em_ocl_arg_i64(&a, A->strides[nd - 2]);
    em_ocl_arg_i64(&a, A->strides[nd - 1]);
    em_ocl_arg_i64(&a, B->strides[nd - 2]);
    em_ocl_arg_i64(&a, B->strides[nd - 1]);
    em_ocl_arg_i64(&a, C->strides[nd - 2]);
    em_ocl_arg_i64(&a, C->strides[nd - 1]);
    em_ocl_arg_i32(&a, nbc);
    em_ocl_arg_long8(&a, bshape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, bst[0], EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, bst[1], EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, bst[2], EM_KARGS_MAX_DIMS);
    /* groups of tile x tile work-items, each group a (4 tile) x (4 tile) block of C */
    const size_t t = (size_t)c.d->tile, bt = 4 * t;
    size_t g[3] = {((size_t)N + bt - 1) / bt * t, ((size_t)M + bt - 1) / bt * t, (size_t)nbatch}, l[3] = {t, t, 1};
    em_ocl_launch(&a, 3, g, l, "matmul");
}
