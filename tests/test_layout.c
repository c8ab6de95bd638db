/* Layout ops: views, contiguous, slicing, cat/stack/split/chunk, cast, pad,
 * copy_ (tasks/layout.c). Reference values computed by hand with PyTorch
 * semantics. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define CLOSE(t, ...) em_test_assert_close((t), VALS(__VA_ARGS__), 0, 0)
#define ASSERT_SHAPE(t, ...) em_test_assert_shape((t), NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__))

/* arange(n) in f32 reshaped to shape (a contiguous tensor). */
static em_tensor *iota(const int64_t *shape, int nd)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (float)i;
    em_tensor *t = em_from_host(v, shape, nd, EM_F32);
    free(v);
    assert_non_null(t);
    return t;
}
#define IOTA(...) iota(SHAPE(__VA_ARGS__), NDIM(__VA_ARGS__))

/* ---- reshape family ---------------------------------------------------------- */

static void test_reshape_view(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *r = em_reshape(a, SHAPE(3, 2), 2);
    ASSERT_SHAPE(r, 3, 2);
    assert_true(em_tensor_shares_storage(a, r));
    CLOSE(r, 1, 2, 3, 4, 5, 6);
    em_tensor *f = em_reshape(a, SHAPE(-1), 1);
    ASSERT_SHAPE(f, 6);
    assert_true(em_tensor_shares_storage(a, f));
    em_tensor *g = em_reshape(a, SHAPE(1, -1, 2), 3);
    ASSERT_SHAPE(g, 1, 3, 2);
    CLOSE(g, 1, 2, 3, 4, 5, 6);
    /* 0-d <-> 1-element */
    em_tensor *s = em_reshape(F32((1), 7), NULL, 0);
    assert_int_equal(em_tensor_ndim(s), 0);
    CLOSE(s, 7);
    em_scope_end();
}

static void test_reshape_noncontiguous(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *t = em_transpose(a, 0, 1); /* [[1,4],[2,5],[3,6]] */
    em_tensor *r = em_reshape(t, SHAPE(6), 1);
    ASSERT_SHAPE(r, 6);
    assert_false(em_tensor_shares_storage(a, r));
    assert_true(em_tensor_is_contiguous(r));
    CLOSE(r, 1, 4, 2, 5, 3, 6);
    /* a view is still possible when only untouched dims are merged/split */
    em_tensor *b = IOTA(2, 3, 4);
    em_tensor *p = em_transpose(b, 0, 1); /* [3, 2, 4], last dim contiguous */
    em_tensor *q = em_reshape(p, SHAPE(3, 2, 2, 2), 4);
    assert_true(em_tensor_shares_storage(b, q));
    em_tensor *qc = em_contiguous(q);
    em_tensor *pc = em_reshape(em_contiguous(p), SHAPE(3, 2, 2, 2), 4);
    double *v1 = em_test_values(qc), *v2 = em_test_values(pc);
    for (int i = 0; i < 24; i++) assert_true(v1[i] == v2[i]);
    free(v1);
    free(v2);
    em_scope_end();
}

static void test_reshape_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_test_assert_error(em_reshape(a, SHAPE(4, 2), 2), "em_reshape", "[2, 3]", "[4, 2]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_reshape(a, SHAPE(4, -1), 2), "[2, 3]", "[4, -1]", NULL);
    em_test_assert_error(em_reshape(a, SHAPE(-1, -1), 2), "only one dim", NULL);
    em_test_assert_error(em_reshape(NULL, SHAPE(6), 1), "em_reshape", "NULL", NULL);
    em_test_assert_error(em_reshape(a, SHAPE(1, 1, 1, 1, 1, 1, 1, 2, 3), 9), "rank 9", NULL);
    em_scope_end();
}

static void test_flatten(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = IOTA(2, 3, 4);
    em_tensor *f = em_flatten(a, 1, 2);
    ASSERT_SHAPE(f, 2, 12);
    assert_true(em_tensor_shares_storage(a, f));
    em_tensor *g = em_flatten(a, 0, -1);
    ASSERT_SHAPE(g, 24);
    em_tensor *h = em_flatten(a, 0, 1);
    ASSERT_SHAPE(h, 6, 4);
    em_tensor *t = em_flatten(em_transpose(a, 0, 2), 0, 1); /* [4,3,2] -> [12, 2], needs a copy */
    ASSERT_SHAPE(t, 12, 2);
    double *v = em_test_values(t);
    /* t[i*3+j][k] = a[k][j][i] = k*12 + j*4 + i */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) assert_true(v[(i * 3 + j) * 2 + k] == k * 12 + j * 4 + i);
    free(v);
    em_test_assert_error(em_flatten(a, 2, 1), "em_flatten", NULL);
    em_test_assert_error(em_flatten(a, 0, 3), "em_flatten", "dim 3", NULL);
    em_scope_end();
}

static void test_squeeze_unsqueeze(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((1, 3, 1), 1, 2, 3);
    em_tensor *s0 = em_squeeze(a, 0);
    ASSERT_SHAPE(s0, 3, 1);
    assert_true(em_tensor_shares_storage(a, s0));
    em_tensor *s1 = em_squeeze(a, 1); /* size 3: unchanged */
    ASSERT_SHAPE(s1, 1, 3, 1);
    em_tensor *sl = em_squeeze(a, -1);
    ASSERT_SHAPE(sl, 1, 3);
    em_tensor *sa = em_squeeze_all(a);
    ASSERT_SHAPE(sa, 3);
    CLOSE(sa, 1, 2, 3);
    em_tensor *u0 = em_unsqueeze(sa, 0);
    ASSERT_SHAPE(u0, 1, 3);
    em_tensor *u1 = em_unsqueeze(sa, -1);
    ASSERT_SHAPE(u1, 3, 1);
    assert_true(em_tensor_shares_storage(a, u1));
    CLOSE(u1, 1, 2, 3);
    em_tensor *b = IOTA(2, 3);
    em_tensor *u2 = em_unsqueeze(b, 1);
    ASSERT_SHAPE(u2, 2, 1, 3);
    em_tensor *u3 = em_unsqueeze(b, 2);
    ASSERT_SHAPE(u3, 2, 3, 1);
    CLOSE(u3, 0, 1, 2, 3, 4, 5);
    em_test_assert_error(em_squeeze(a, 3), "em_squeeze", "dim 3", NULL);
    em_test_assert_error(em_unsqueeze(b, 4), "em_unsqueeze", "dim 4", NULL);
    em_test_assert_error(em_unsqueeze(NULL, 0), "NULL", NULL);
    /* rank above 8 */
    em_tensor *r8 = em_zeros(SHAPE(1, 1, 1, 1, 1, 1, 1, 2), 8, EM_F32);
    em_test_assert_error(em_unsqueeze(r8, 0), "em_unsqueeze", "rank 9", "8", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_scope_end();
}

static void test_transpose_contiguous(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *t = em_transpose(a, 0, 1);
    ASSERT_SHAPE(t, 3, 2);
    assert_true(em_tensor_shares_storage(a, t));
    assert_false(em_tensor_is_contiguous(t));
    assert_int_equal(em_tensor_strides(t)[0], 1);
    assert_int_equal(em_tensor_strides(t)[1], 3);
    CLOSE(t, 1, 4, 2, 5, 3, 6);
    em_tensor *c = em_contiguous(t);
    assert_true(em_tensor_is_contiguous(c));
    assert_false(em_tensor_shares_storage(a, c));
    CLOSE(c, 1, 4, 2, 5, 3, 6);
    /* already contiguous: a new header over the same storage, no copy */
    em_tensor *same = em_contiguous(a);
    assert_ptr_not_equal(same, a);
    assert_true(em_tensor_shares_storage(same, a));
    em_tensor *tt = em_transpose(a, -1, -2);
    CLOSE(tt, 1, 4, 2, 5, 3, 6);
    em_test_assert_error(em_transpose(a, 0, 5), "em_transpose", "dim 5", NULL);
    em_test_assert_error(em_contiguous(NULL), "NULL", NULL);
    em_scope_end();
}

static void test_permute(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = IOTA(2, 3, 4);
    em_tensor *p = em_permute(a, (const int[]){2, 0, 1}, 3);
    ASSERT_SHAPE(p, 4, 2, 3);
    assert_true(em_tensor_shares_storage(a, p));
    double *v = em_test_values(p);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) assert_true(v[(i * 2 + j) * 3 + k] == j * 12 + k * 4 + i);
    free(v);
    em_tensor *q = em_permute(a, (const int[]){-1, 1, 0}, 3);
    ASSERT_SHAPE(q, 4, 3, 2);
    em_test_assert_error(em_permute(a, (const int[]){0, 0, 1}, 3), "em_permute", "not a permutation", NULL);
    em_test_assert_error(em_permute(a, (const int[]){0, 1, 3}, 3), "not a permutation", NULL);
    em_test_assert_error(em_permute(a, (const int[]){0, 1}, 2), "em_permute", "[2, 3, 4]", NULL);
    em_scope_end();
}

static void test_expand(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((3, 1), 1, 2, 3);
    em_tensor *e = em_expand(a, SHAPE(2, -1, 4), 3);
    ASSERT_SHAPE(e, 2, 3, 4);
    assert_true(em_tensor_shares_storage(a, e));
    assert_int_equal(em_tensor_strides(e)[0], 0);
    assert_int_equal(em_tensor_strides(e)[2], 0);
    CLOSE(e, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    em_tensor *c = em_contiguous(e);
    assert_true(em_tensor_is_contiguous(c));
    CLOSE(c, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    em_test_assert_error(em_expand(a, SHAPE(4, 4), 2), "em_expand", "[3, 1]", "[4, 4]", NULL);
    em_test_assert_error(em_expand(a, SHAPE(4), 1), "em_expand", NULL);
    em_scope_end();
}

/* ---- slicing ----------------------------------------------------------------- */

static void test_slice(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = IOTA(10);
    em_tensor *s = em_slice(a, 0, -7, 10, 2); /* a[-7::2] */
    ASSERT_SHAPE(s, 4);
    assert_true(em_tensor_shares_storage(a, s));
    CLOSE(s, 3, 5, 7, 9);
    CLOSE(em_slice(a, 0, -100, 100, 3), 0, 3, 6, 9);
    CLOSE(em_slice(a, 0, 2, -5, 1), 2, 3, 4);
    em_tensor *empty = em_slice(a, 0, 5, 2, 1);
    ASSERT_SHAPE(empty, 0);
    em_tensor *b = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *c = em_slice(b, 1, 0, 3, 2);
    ASSERT_SHAPE(c, 2, 2);
    CLOSE(c, 1, 3, 4, 6);
    CLOSE(em_slice(b, -2, 1, 2, 1), 4, 5, 6);
    /* slice of a slice */
    CLOSE(em_slice(s, 0, 1, 4, 2), 5, 9);
    em_test_assert_error(em_slice(a, 0, 0, 5, 0), "em_slice", "step", NULL);
    em_test_assert_error(em_slice(a, 0, 0, 5, -1), "step", NULL);
    em_test_assert_error(em_slice(b, 2, 0, 1, 1), "em_slice", "dim 2", NULL);
    em_scope_end();
}

static void test_narrow(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *n = em_narrow(a, 1, 1, 2);
    ASSERT_SHAPE(n, 2, 2);
    assert_true(em_tensor_shares_storage(a, n));
    CLOSE(n, 2, 3, 5, 6);
    CLOSE(em_narrow(a, 0, -1, 1), 4, 5, 6);
    ASSERT_SHAPE(em_narrow(a, 1, 3, 0), 2, 0);
    em_test_assert_error(em_narrow(a, 1, 2, 2), "em_narrow", NULL);
    em_test_assert_error(em_narrow(a, 1, 4, 0), "em_narrow", NULL);
    em_test_assert_error(em_narrow(a, 0, 0, -1), "em_narrow", NULL);
    em_scope_end();
}

/* ---- cat / stack / split / chunk ---------------------------------------------- */

static void test_cat(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 2), 1, 2, 3, 4);
    em_tensor *b = F32((1, 2), 5, 6);
    em_tensor *c0 = em_cat((em_tensor *[]){a, b}, 2, 0);
    ASSERT_SHAPE(c0, 3, 2);
    CLOSE(c0, 1, 2, 3, 4, 5, 6);
    em_tensor *d = F32((2, 3), 7, 8, 9, 10, 11, 12);
    em_tensor *c1 = em_cat((em_tensor *[]){a, d}, 2, 1);
    ASSERT_SHAPE(c1, 2, 5);
    CLOSE(c1, 1, 2, 7, 8, 9, 3, 4, 10, 11, 12);
    em_tensor *e = F32((2, 1), -1, -2);
    em_tensor *c3 = em_cat((em_tensor *[]){e, a, e}, 3, -1);
    ASSERT_SHAPE(c3, 2, 4);
    CLOSE(c3, -1, 1, 2, -1, -2, 3, 4, -2);
    /* strided (transposed) input */
    em_tensor *c4 = em_cat((em_tensor *[]){em_transpose(a, 0, 1), b}, 2, 0);
    CLOSE(c4, 1, 3, 2, 4, 5, 6);
    /* single input, and empty pieces */
    CLOSE(em_cat((em_tensor *[]){a}, 1, 0), 1, 2, 3, 4);
    em_tensor *z = em_zeros(SHAPE(0, 2), 2, EM_F32);
    CLOSE(em_cat((em_tensor *[]){z, b, z}, 3, 0), 5, 6);
    /* dtype promotion, as torch.cat */
    int32_t iv[2] = {7, 8};
    em_tensor *ib = em_from_host(iv, SHAPE(1, 2), 2, EM_I32);
    em_tensor *cp = em_cat((em_tensor *[]){ib, a}, 2, 0);
    assert_int_equal(em_tensor_dtype(cp), EM_F32);
    CLOSE(cp, 7, 8, 1, 2, 3, 4);
    /* errors */
    em_tensor *bad = F32((2, 4), 0, 0, 0, 0, 0, 0, 0, 0);
    em_test_assert_error(em_cat((em_tensor *[]){b, bad}, 2, 0), "em_cat", "tensor 1", "[2, 4]", "[1, 2]", "dim 0", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_cat((em_tensor *[]){a, F32((4), 1, 2, 3, 4)}, 2, 0), "em_cat", NULL);
    em_test_assert_error(em_cat((em_tensor *[]){a, NULL}, 2, 0), "em_cat", "NULL", NULL);
    em_test_assert_error(em_cat((em_tensor *[]){a, a}, 2, 2), "em_cat", "dim 2", NULL);
    em_test_assert_error(em_cat(NULL, 0, 0), "em_cat", NULL);
    em_scope_end();
}

static void test_stack(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2), 1, 2), *b = F32((2), 3, 4), *c = F32((2), 5, 6);
    em_tensor *s0 = em_stack((em_tensor *[]){a, b, c}, 3, 0);
    ASSERT_SHAPE(s0, 3, 2);
    CLOSE(s0, 1, 2, 3, 4, 5, 6);
    em_tensor *s1 = em_stack((em_tensor *[]){a, b, c}, 3, 1);
    ASSERT_SHAPE(s1, 2, 3);
    CLOSE(s1, 1, 3, 5, 2, 4, 6);
    em_tensor *sl = em_stack((em_tensor *[]){a, b}, 2, -1);
    ASSERT_SHAPE(sl, 2, 2);
    CLOSE(sl, 1, 3, 2, 4);
    em_test_assert_error(em_stack((em_tensor *[]){a, F32((3), 1, 2, 3)}, 2, 0), "em_stack", "[3]", "[2]", NULL);
    em_test_assert_error(em_stack((em_tensor *[]){a, b}, 2, 2), "em_stack", "dim 2", NULL);
    em_scope_end();
}

static void test_split_chunk(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = IOTA(5);
    em_tensor *out[8] = {0};
    assert_int_equal(em_split(a, 2, 0, out, 8), 3);
    ASSERT_SHAPE(out[0], 2);
    ASSERT_SHAPE(out[2], 1);
    assert_true(em_tensor_shares_storage(a, out[1]));
    CLOSE(out[0], 0, 1);
    CLOSE(out[1], 2, 3);
    CLOSE(out[2], 4);
    em_tensor *b = IOTA(2, 5);
    assert_int_equal(em_split(b, 3, 1, out, 8), 2);
    CLOSE(out[0], 0, 1, 2, 5, 6, 7);
    CLOSE(out[1], 3, 4, 8, 9);
    assert_true(em_split(a, 1, 0, out, 4) < 0);
    assert_non_null(strstr(em_last_error(), "max_out"));
    assert_true(em_split(a, 0, 0, out, 8) < 0);
    assert_true(em_split(a, 2, 1, out, 8) < 0);
    assert_non_null(strstr(em_last_error(), "dim 1"));

    assert_int_equal(em_chunk(a, 3, 0, out, 8), 3);
    CLOSE(out[0], 0, 1);
    CLOSE(out[1], 2, 3);
    CLOSE(out[2], 4);
    em_tensor *c = IOTA(6);
    assert_int_equal(em_chunk(c, 4, 0, out, 8), 3); /* as torch.chunk: pieces of 2 */
    CLOSE(out[2], 4, 5);
    assert_int_equal(em_chunk(b, 2, 0, out, 8), 2);
    CLOSE(out[1], 5, 6, 7, 8, 9);
    assert_true(em_chunk(a, 0, 0, out, 8) < 0);
    em_scope_end();
}

/* ---- cast / pad / copy_ ------------------------------------------------------------ */

static void test_cast(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((6), 1.7f, -1.7f, 2.5f, -0.2f, 0.0f, 300.9f);
    em_tensor *i = em_cast(a, EM_I32);
    assert_int_equal(em_tensor_dtype(i), EM_I32);
    CLOSE(i, 1, -1, 2, 0, 0, 300);
    em_tensor *l = em_cast(a, EM_I64);
    CLOSE(l, 1, -1, 2, 0, 0, 300);
    em_tensor *b = em_cast(a, EM_BOOL);
    assert_int_equal(em_tensor_dtype(b), EM_BOOL);
    CLOSE(b, 1, 1, 1, 1, 0, 1);
    em_tensor *d = em_cast(i, EM_F64);
    assert_int_equal(em_tensor_dtype(d), EM_F64);
    CLOSE(d, 1, -1, 2, 0, 0, 300);
    /* strided input */
    em_tensor *m = F32((2, 2), 1.5f, 2.5f, 3.5f, 4.5f);
    CLOSE(em_cast(em_transpose(m, 0, 1), EM_I32), 1, 3, 2, 4);
    em_tensor *same = em_cast(a, EM_F32);
    assert_int_equal(em_tensor_dtype(same), EM_F32);
    CLOSE(same, 1.7f, -1.7f, 2.5f, -0.2f, 0.0f, 300.9f);
    em_test_assert_error(em_cast(a, (em_dtype)EM_DTYPE_COUNT), "em_cast", NULL);
    em_test_assert_error(em_cast(NULL, EM_F32), "NULL", NULL);
    em_scope_end();
}

static void test_pad(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 2), 1, 2, 3, 4);
    em_tensor *p = em_pad(a, (const int64_t[]){1, 1}, 2, 0.0);
    ASSERT_SHAPE(p, 2, 4);
    CLOSE(p, 0, 1, 2, 0, 0, 3, 4, 0);
    em_tensor *q = em_pad(a, (const int64_t[]){0, 1, 2, 0}, 4, -1.0);
    ASSERT_SHAPE(q, 4, 3);
    CLOSE(q, -1, -1, -1, -1, -1, -1, 1, 2, -1, 3, 4, -1);
    /* negative pads crop: last dim left +1 right -1, first dim top -1 bottom +1 */
    em_tensor *r = em_pad(a, (const int64_t[]){1, -1, -1, 1}, 4, 9.0);
    ASSERT_SHAPE(r, 2, 2);
    CLOSE(r, 9, 3, 9, 9);
    /* integer dtype */
    int32_t iv[3] = {1, 2, 3};
    em_tensor *ia = em_from_host(iv, SHAPE(3), 1, EM_I32);
    em_tensor *ip = em_pad(ia, (const int64_t[]){2, 0}, 2, 7.0);
    assert_int_equal(em_tensor_dtype(ip), EM_I32);
    CLOSE(ip, 7, 7, 1, 2, 3);
    em_test_assert_error(em_pad(a, (const int64_t[]){1}, 1, 0.0), "em_pad", NULL);
    em_test_assert_error(em_pad(a, (const int64_t[]){1, 1, 1, 1, 1, 1}, 6, 0.0), "em_pad", NULL);
    em_test_assert_error(em_pad(a, (const int64_t[]){-2, -1}, 2, 0.0), "em_pad", NULL);
    em_scope_end();
}

static void test_pad_grad(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 2), 1, 2, 3, 4);
    assert_int_equal(em_set_requires_grad(a, true), EM_OK);
    em_tensor *p = em_pad(a, (const int64_t[]){1, -1, 0, 1}, 4, 5.0); /* [3, 2] */
    ASSERT_SHAPE(p, 3, 2);
    CLOSE(p, 5, 1, 5, 3, 5, 5);
    em_tensor *go = F32((3, 2), 10, 11, 12, 13, 14, 15);
    em_grads *g = em_backward_with(p, go);
    if (!g) fail_msg("em_backward_with: %s", em_last_error());
    em_tensor *ga = em_grad(g, a);
    ASSERT_SHAPE(ga, 2, 2);
    CLOSE(ga, 11, 0, 13, 0);
    em_grads_free(g);
    em_scope_end();
}

static void test_cat_grad(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 1), 1, 2), *b = F32((2, 2), 3, 4, 5, 6);
    assert_int_equal(em_set_requires_grad(a, true), EM_OK);
    assert_int_equal(em_set_requires_grad(b, true), EM_OK);
    em_tensor *c = em_cat((em_tensor *[]){a, b}, 2, 1);
    em_tensor *go = F32((2, 3), 10, 11, 12, 13, 14, 15);
    em_grads *g = em_backward_with(c, go);
    if (!g) fail_msg("em_backward_with: %s", em_last_error());
    CLOSE(em_grad(g, a), 10, 13);
    CLOSE(em_grad(g, b), 11, 12, 14, 15);
    em_grads_free(g);
    em_scope_end();
}

static void test_copy_(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *z = em_zeros(SHAPE(3, 4), 2, EM_F32);
    em_tensor *v = em_slice(z, 1, 1, 3, 1); /* [3, 2] view */
    assert_int_equal(em_copy_(v, F32((2), 7, 8)), EM_OK);
    CLOSE(z, 0, 7, 8, 0, 0, 7, 8, 0, 0, 7, 8, 0);
    /* strided (step) destination, cast from i32 */
    int32_t iv[2] = {-1, -2};
    em_tensor *w = em_slice(em_transpose(z, 0, 1), 0, 0, 4, 3); /* columns 0 and 3: [2, 3] */
    assert_int_equal(em_copy_(w, em_from_host(iv, SHAPE(2, 1), 2, EM_I32)), EM_OK);
    CLOSE(z, -1, 7, 8, -2, -1, 7, 8, -2, -1, 7, 8, -2);
    /* overlapping source and destination: the source is read before writing */
    em_tensor *a = IOTA(4);
    assert_int_equal(em_copy_(em_slice(a, 0, 1, 4, 1), em_slice(a, 0, 0, 3, 1)), EM_OK);
    CLOSE(a, 0, 0, 1, 2);
    assert_int_equal(em_copy_(z, F32((3), 1, 2, 3)), EM_ERR_SHAPE);
    assert_non_null(strstr(em_last_error(), "[3]"));
    assert_int_equal(em_copy_(NULL, z), EM_ERR_INVALID);
    assert_int_equal(em_copy_(em_expand(F32((1), 0), SHAPE(3), 1), F32((3), 1, 2, 3)), EM_ERR_INVALID);
    em_scope_end();
}

static void test_no_leak(void **state)
{
    (void)state;
    em_sync();
    em_stats before = em_get_stats();
    em_scope_begin();
    em_tensor *a = IOTA(2, 3, 4);
    em_tensor *t = em_reshape(em_transpose(a, 0, 2), SHAPE(-1), 1);
    em_tensor *out[4];
    em_split(t, 10, 0, out, 4);
    em_cat(out, 3, 0);
    em_stack((em_tensor *[]){a, a}, 2, 1);
    em_pad(a, (const int64_t[]){1, 1}, 2, 0);
    em_contiguous(a);
    em_cast(a, EM_I32);
    em_scope_end();
    em_sync();
    em_stats after = em_get_stats();
    assert_int_equal(after.live_tensors, before.live_tensors);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reshape_view),
        cmocka_unit_test(test_reshape_noncontiguous),
        cmocka_unit_test(test_reshape_errors),
        cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_squeeze_unsqueeze),
        cmocka_unit_test(test_transpose_contiguous),
        cmocka_unit_test(test_permute),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_narrow),
        cmocka_unit_test(test_cat),
        cmocka_unit_test(test_stack),
        cmocka_unit_test(test_split_chunk),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_cat_grad),
        cmocka_unit_test(test_pad_grad),
        cmocka_unit_test(test_copy_),
        cmocka_unit_test(test_no_leak),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
