/* Tests of em_matmul (tasks/matmul.c, devices/cpu/matmul.c): torch.matmul
 * semantics, dtype paths, transposed views without copies, the tiled
 * submission of large products, errors. Expected values are hand-computed or
 * come from a naive double-precision product computed here. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

/* Naive reference: C[b, M, N] = A[b, M, K] B[b, K, N] with explicit batch
 * strides in elements (0 = broadcast) over contiguous host matrices. */
static double *ref_bmm(const double *A, const double *B, int64_t nb, int64_t sa, int64_t sb, int64_t M, int64_t K,
                       int64_t N)
{
    int64_t n = nb * M * N;
    double *C = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t q = 0; q < K; q++) s += A[b * sa + i * K + q] * B[b * sb + q * N + j];
                C[(b * M + i) * N + j] = s;
            }
    return C;
}

/* Deterministic pseudo-random f32 tensor and its values as doubles. */
static em_tensor *rand_f32(const int64_t *shape, int nd, double **host, uint32_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    *host = malloc(sizeof(double) * (size_t)(n ? n : 1));
    uint32_t x = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        f[i] = (float)((x >> 8) & 0xffff) / 65536.0f - 0.5f;
        (*host)[i] = f[i];
    }
    em_tensor *t = em_from_host(f, shape, nd, EM_F32);
    free(f);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

static int64_t tasks_now(void) { return em_get_stats().tasks_submitted; }

/* ---- semantics -------------------------------------------------------------------- */

static void test_2x3_3x2(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *b = F32((3, 2), 7, 8, 9, 10, 11, 12);
    em_tensor *c = em_matmul(a, b);
    em_test_assert_shape(c, 2, SHAPE(2, 2));
    assert_int_equal(em_tensor_dtype(c), EM_F32);
    /* [1*7+2*9+3*11, 1*8+2*10+3*12; 4*7+5*9+6*11, 4*8+5*10+6*12] */
    em_test_assert_close(c, VALS(58, 64, 139, 154), 0, 0);
    em_scope_end();
}

static void test_vector_vector(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((3), 1, 2, 3);
    em_tensor *b = F32((3), 4, 5, 6);
    em_tensor *c = em_matmul(a, b);
    em_test_assert_shape(c, 0, NULL);
    double v;
    assert_int_equal(em_item(c, &v), EM_OK);
    assert_true(v == 32.0); /* 4 + 10 + 18 */
    em_scope_end();
}

static void test_matrix_vector(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *v = F32((3), 1, 0, -1);
    em_tensor *c = em_matmul(a, v);
    em_test_assert_shape(c, 1, SHAPE(2));
    em_test_assert_close(c, VALS(-2, -2), 0, 0);
    em_scope_end();
}

static void test_vector_matrix(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *v = F32((2), 1, 2);
    em_tensor *b = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *c = em_matmul(v, b);
    em_test_assert_shape(c, 1, SHAPE(3));
    em_test_assert_close(c, VALS(9, 12, 15), 0, 0);
    em_scope_end();
}

static void test_batched_broadcast(void **state)
{
    (void)state;
    em_scope_begin();
    double *ha, *hb;
    em_tensor *a = rand_f32(SHAPE(2, 1, 2, 3), 4, &ha, 1);
    em_tensor *b = rand_f32(SHAPE(3, 3, 2), 3, &hb, 2);
    em_tensor *c = em_matmul(a, b);
    em_test_assert_shape(c, 4, SHAPE(2, 3, 2, 2));
    /* batch (i, j): a[i, 0], b[j] */
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            double *r = ref_bmm(ha + i * 6, hb + j * 6, 1, 0, 0, 2, 3, 2);
            memcpy(want + (i * 3 + j) * 4, r, sizeof(double) * 4);
            free(r);
        }
    em_test_assert_close(c, want, 24, 1e-6, 1e-6);

    /* batched x 1-D and 1-D x batched: the promoted dim disappears */
    em_tensor *v = F32((3), 1, 2, 3);
    em_tensor *bv = em_matmul(a, v);
    em_test_assert_shape(bv, 3, SHAPE(2, 1, 2));
    double w2[4];
    for (int i = 0; i < 4; i++) w2[i] = ha[i * 3] + 2 * ha[i * 3 + 1] + 3 * ha[i * 3 + 2];
    em_test_assert_close(bv, w2, 4, 1e-6, 1e-6);
    em_tensor *u = F32((3), 1, -1, 2);
    em_tensor *vb = em_matmul(u, b);
    em_test_assert_shape(vb, 2, SHAPE(3, 2));
    double w3[6];
    for (int j = 0; j < 3; j++)
        for (int n = 0; n < 2; n++) w3[j * 2 + n] = hb[j * 6 + n] - hb[j * 6 + 2 + n] + 2 * hb[j * 6 + 4 + n];
    em_test_assert_close(vb, w3, 6, 1e-6, 1e-6);
    free(ha);
    free(hb);
    em_scope_end();
}

/* Transposed views go to BLAS as Trans: exactly one task, no copy. */
static void test_transposed_views(void **state)
{
    (void)state;
    em_scope_begin();
    double *hx, *hy;
    em_tensor *x = rand_f32(SHAPE(3, 2), 2, &hx, 3); /* a = x^T [2, 3] */
    em_tensor *y = rand_f32(SHAPE(4, 3), 2, &hy, 4); /* b = y^T [3, 4] */
    em_tensor *a = em_transpose(x, 0, 1);
    em_tensor *b = em_transpose(y, 0, 1);
    assert_non_null(a);
    assert_non_null(b);
    assert_false(em_tensor_is_contiguous(a));
    double ha[6], hb[12];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) ha[i * 3 + k] = hx[k * 2 + i];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) hb[k * 4 + j] = hy[j * 3 + k];
    double *want = ref_bmm(ha, hb, 1, 0, 0, 2, 3, 4);

    int64_t t0 = tasks_now();
    em_tensor *c = em_matmul(a, b);
    assert_int_equal(tasks_now() - t0, 1);
    em_test_assert_shape(c, 2, SHAPE(2, 4));
    em_test_assert_close(c, want, 8, 1e-6, 1e-6);

    /* one transposed, one not */
    em_tensor *bc = F32((3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    double hbc[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    double *want2 = ref_bmm(ha, hbc, 1, 0, 0, 2, 3, 4);
    t0 = tasks_now();
    em_tensor *c2 = em_matmul(a, bc);
    assert_int_equal(tasks_now() - t0, 1);
    em_test_assert_close(c2, want2, 8, 1e-6, 1e-6);

    /* batched transposed view: [2, 3, 4] -> [2, 4, 3] (strides 12, 1, 4) */
    double *hz;
    em_tensor *z = rand_f32(SHAPE(2, 3, 4), 3, &hz, 5);
    em_tensor *zt = em_transpose(z, 1, 2);
    double hzt[24];
    for (int bb = 0; bb < 2; bb++)
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 3; k++) hzt[bb * 12 + i * 3 + k] = hz[bb * 12 + k * 4 + i];
    em_tensor *v = F32((3, 2), 1, 0, 0, 1, 1, 1);
    double hv[6] = {1, 0, 0, 1, 1, 1};
    double *want3 = ref_bmm(hzt, hv, 2, 12, 0, 4, 3, 2);
    t0 = tasks_now();
    em_tensor *c3 = em_matmul(zt, v);
    assert_int_equal(tasks_now() - t0, 1);
    em_test_assert_shape(c3, 3, SHAPE(2, 4, 2));
    em_test_assert_close(c3, want3, 16, 1e-6, 1e-6);

    /* a layout BLAS cannot take (both strides > 1): copied first, still right */
    double *hw;
    em_tensor *w = rand_f32(SHAPE(4, 6), 2, &hw, 6);
    em_tensor *ws = em_slice(w, 1, 0, 6, 2); /* [4, 3], strides (6, 2) */
    em_tensor *wss = em_slice(ws, 0, 0, 4, 2); /* [2, 3], strides (12, 2) */
    assert_non_null(wss);
    double hwss[6];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) hwss[i * 3 + k] = hw[(2 * i) * 6 + 2 * k];
    double *want4 = ref_bmm(hwss, hbc, 1, 0, 0, 2, 3, 4);
    em_tensor *c4 = em_matmul(wss, bc);
    em_test_assert_close(c4, want4, 8, 1e-6, 1e-6);

    free(hx), free(hy), free(hz), free(hw);
    free(want), free(want2), free(want3), free(want4);
    em_scope_end();
}

/* ---- dtypes ------------------------------------------------------------------------ */

static void test_f64(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F64((2, 2), 1.5, -2, 0.25, 4);
    em_tensor *b = F64((2, 2), 2, 1e-3, -1, 3);
    em_tensor *c = em_matmul(a, b);
    assert_int_equal(em_tensor_dtype(c), EM_F64);
    /* [1.5*2 + 2, 1.5e-3 - 6; 0.5 - 4, 0.25e-3 + 12] */
    em_test_assert_close(c, VALS(5, -5.9985, -3.5, 12.00025), 1e-15, 0);

    /* f32 x f64 promotes to f64 */
    em_tensor *a32 = F32((1, 2), 1, 2);
    em_tensor *c2 = em_matmul(a32, b);
    assert_int_equal(em_tensor_dtype(c2), EM_F64);
    em_test_assert_close(c2, VALS(0, 6.001), 1e-15, 0);

    /* transposed f64 */
    em_tensor *at = em_transpose(a, 0, 1);
    em_tensor *c3 = em_matmul(at, b);
    /* a^T = [1.5, 0.25; -2, 4] */
    em_test_assert_close(c3, VALS(2.75, 0.7515, -8, 11.998), 1e-12, 0);
    em_scope_end();
}

static void test_i64(void **state)
{
    (void)state;
    em_scope_begin();
    const int64_t av[] = {1, -2, 3, 4000000000LL, 5, 6};
    const int64_t bv[] = {7, 8, 9, 10, 11, 12};
    em_tensor *a = em_from_host(av, SHAPE(2, 3), 2, EM_I64);
    em_tensor *b = em_from_host(bv, SHAPE(3, 2), 2, EM_I64);
    em_tensor *c = em_matmul(a, b);
    assert_int_equal(em_tensor_dtype(c), EM_I64);
    int64_t got[4];
    assert_int_equal(em_to_host(c, got, sizeof got), EM_OK);
    assert_true(got[0] == 7 - 18 + 33);
    assert_true(got[1] == 8 - 20 + 36);
    assert_true(got[2] == 28000000000LL + 45 + 66);
    assert_true(got[3] == 32000000000LL + 50 + 72);

    /* i32 x i64 -> i64; i32 x i32 stays i32; transposed int view */
    const int32_t iv[] = {1, 2, 3, 4};
    em_tensor *i32 = em_from_host(iv, SHAPE(2, 2), 2, EM_I32);
    em_tensor *m = em_matmul(i32, em_from_host((const int64_t[]){1, 1, 1, 1}, SHAPE(2, 2), 2, EM_I64));
    assert_int_equal(em_tensor_dtype(m), EM_I64);
    em_test_assert_close(m, VALS(3, 3, 7, 7), 0, 0);
    em_tensor *m2 = em_matmul(i32, em_transpose(i32, 0, 1));
    assert_int_equal(em_tensor_dtype(m2), EM_I32);
    em_test_assert_close(m2, VALS(5, 11, 11, 25), 0, 0);

    /* int x float promotes to float */
    em_tensor *mf = em_matmul(i32, F32((2), 0.5, 0.25));
    assert_int_equal(em_tensor_dtype(mf), EM_F32);
    em_test_assert_close(mf, VALS(1, 2.5), 0, 0);
    em_scope_end();
}

/* Zero-size tensors made with em_from_host (which writes the handle even
 * when there are no elements). */
static em_tensor *empty_t(const int64_t *shape, int nd, em_dtype dt)
{
    static const double dummy[1] = {0};
    em_tensor *t = em_from_host(dummy, shape, nd, dt);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

static void test_empty_dims(void **state)
{
    (void)state;
    em_scope_begin();
    /* K == 0: zeros */
    em_tensor *c = em_matmul(empty_t(SHAPE(2, 0), 2, EM_F32), empty_t(SHAPE(0, 3), 2, EM_F32));
    em_test_assert_shape(c, 2, SHAPE(2, 3));
    em_test_assert_close(c, VALS(0, 0, 0, 0, 0, 0), 0, 0);
    em_tensor *ci = em_matmul(empty_t(SHAPE(2, 0), 2, EM_I64), empty_t(SHAPE(0, 2), 2, EM_I64));
    em_test_assert_close(ci, VALS(0, 0, 0, 0), 0, 0);
    em_tensor *cv = em_matmul(empty_t(SHAPE(0), 1, EM_F64), empty_t(SHAPE(0), 1, EM_F64));
    double v = -1;
    assert_int_equal(em_item(cv, &v), EM_OK);
    assert_true(v == 0.0);
    /* M == 0, empty batch */
    em_tensor *m0 = em_matmul(empty_t(SHAPE(0, 3), 2, EM_F32), em_ones(SHAPE(3, 2), 2, EM_F32));
    em_test_assert_shape(m0, 2, SHAPE(0, 2));
    em_tensor *b0 = em_matmul(empty_t(SHAPE(0, 2, 3), 3, EM_F32), em_ones(SHAPE(3, 2), 2, EM_F32));
    em_test_assert_shape(b0, 3, SHAPE(0, 2, 2));
    /* N == 0 ([2, 0] result) is not exercised: em_tensor_is_contiguous()
     * calls a [2, 0] tensor non-contiguous, so the funnel submits its output
     * as RW on a never-written handle and StarPU aborts (same for
     * em_zeros(SHAPE(2, 0))). Reported; add the case once that is fixed. */
    assert_int_equal(em_sync(), EM_OK);
    em_scope_end();
}

/* ---- tiling -------------------------------------------------------------------------- */

/* 300x200 . 200x250 f32 (3e7 flops): tiled over the CPU workers, checked
 * against a double-precision reference. */
static void test_large_tiled(void **state)
{
    (void)state;
    setenv("EMBER_MATMUL_TILE_MIN_FLOPS", "1e6", 1);
    em_scope_begin();
    const int64_t M = 300, K = 200, N = 250;
    double *ha, *hb;
    em_tensor *a = rand_f32(SHAPE(M, K), 2, &ha, 7);
    em_tensor *b = rand_f32(SHAPE(K, N), 2, &hb, 8);
    double *want = ref_bmm(ha, hb, 1, 0, 0, M, K, N);
    int nw = em_worker_count(EM_DEVICE_CPU);

    int64_t t0 = tasks_now();
    em_tensor *c = em_matmul(a, b);
    int64_t nt = tasks_now() - t0;
    /* one task per worker, plus one copy per tile after the first */
    if (nw >= 2) assert_int_equal(nt, 2 * nw - 1);
    else assert_int_equal(nt, 1);
    em_test_assert_shape(c, 2, SHAPE(M, N));
    em_test_assert_close(c, want, M * N, 1e-4, 1e-4);

    /* uneven row tiles, and a transposed operand inside the tiles */
    setenv("EMBER_MATMUL_TILES", "7", 1);
    em_tensor *bt_src = em_contiguous(em_transpose(b, 0, 1)); /* [N, K] */
    em_tensor *bt = em_transpose(bt_src, 0, 1);                /* [K, N], strides (1, K) */
    em_tensor *c2 = em_matmul(a, bt);
    em_test_assert_close(c2, want, M * N, 1e-4, 1e-4);

    /* split over the batch dim, with a broadcast rhs */
    double *hx;
    em_tensor *x = rand_f32(SHAPE(9, 40, K), 3, &hx, 9);
    double *want3 = ref_bmm(hx, hb, 9, 40 * K, 0, 40, K, N);
    em_tensor *c3 = em_matmul(x, b);
    em_test_assert_shape(c3, 3, SHAPE(9, 40, N));
    em_test_assert_close(c3, want3, 9 * 40 * N, 1e-4, 1e-4);

    /* tiling off: same values */
    setenv("EMBER_MATMUL_TILES", "1", 1);
    t0 = tasks_now();
    em_tensor *c4 = em_matmul(a, b);
    assert_int_equal(tasks_now() - t0, 1);
    em_test_assert_close(c4, want, M * N, 1e-4, 1e-4);

    unsetenv("EMBER_MATMUL_TILES");
    unsetenv("EMBER_MATMUL_TILE_MIN_FLOPS");
    free(ha), free(hb), free(hx), free(want), free(want3);
    em_scope_end();
    em_stats s = em_get_stats();
    assert_int_equal(s.live_tensors, 0);
}

/* ---- errors --------------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = em_ones(SHAPE(2, 3), 2, EM_F32);
    em_tensor *b = em_ones(SHAPE(4, 5), 2, EM_F32);
    em_test_assert_error(em_matmul(a, b), "em_matmul", "[2, 3]", "[4, 5]", "3 (dim 1) != 4 (dim 0)", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_matmul(a, em_ones(SHAPE(4), 1, EM_F32)), "[2, 3]", "[4]", NULL);
    em_test_assert_error(em_matmul(em_ones(SHAPE(3), 1, EM_F32), a), "[3]", "[2, 3]", "3 (dim 0) != 2 (dim 0)", NULL);
    em_test_assert_error(em_matmul(NULL, b), "em_matmul", "NULL", NULL);
    em_test_assert_error(em_matmul(a, NULL), "em_matmul", "NULL", NULL);
    em_tensor *s = em_scalar(2, EM_F32);
    em_test_assert_error(em_matmul(s, a), "em_matmul", "[]", "[2, 3]", NULL);
    em_test_assert_error(em_matmul(em_ones(SHAPE(2, 2, 3), 3, EM_F32), em_ones(SHAPE(3, 3, 2), 3, EM_F32)), "em_matmul",
                         "[2, 2, 3]", "[3, 3, 2]", "broadcast", NULL);
    em_tensor *m = em_ones(SHAPE(2, 2), 2, EM_BOOL);
    em_test_assert_error(em_matmul(m, m), "em_matmul", "bool", NULL);
    /* a NULL from a failed op propagates */
    em_test_assert_error(em_matmul(em_matmul(a, b), a), "em_matmul", "NULL", NULL);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_2x3_3x2),
        cmocka_unit_test(test_vector_vector),
        cmocka_unit_test(test_matrix_vector),
        cmocka_unit_test(test_vector_matrix),
        cmocka_unit_test(test_batched_broadcast),
        cmocka_unit_test(test_transposed_views),
        cmocka_unit_test(test_f64),
        cmocka_unit_test(test_i64),
        cmocka_unit_test(test_empty_dims),
        cmocka_unit_test(test_large_tiled),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
