/* Indexing ops: gather, scatter, scatter_add, index_select, index_add, one_hot
 * (tasks/index.c, devices/cpu/index.c). Expected values follow PyTorch
 * (several are the examples of the PyTorch documentation). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define CLOSE(t, ...) em_test_assert_close((t), VALS(__VA_ARGS__), 0, 0)
#define ASSERT_SHAPE(t, ...) em_test_assert_shape((t), NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__))

static em_tensor *i64_tensor(const int64_t *v, const int64_t *shape, int nd)
{
    em_tensor *t = em_from_host(v, shape, nd, EM_I64);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}
static em_tensor *i32_tensor(const int32_t *v, const int64_t *shape, int nd)
{
    em_tensor *t = em_from_host(v, shape, nd, EM_I32);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}
#define I64(shape_list, ...) i64_tensor((const int64_t[]){__VA_ARGS__}, SHAPE shape_list, NDIM shape_list)
#define I32(shape_list, ...) i32_tensor((const int32_t[]){__VA_ARGS__}, SHAPE shape_list, NDIM shape_list)

/* An index out of range: on the CPU the kernel's sticky error EM_ERR_INVALID,
 * reported by the next read and naming the op and the value (PyTorch raises);
 * on CUDA / OpenCL no error and the documented value (want, n floats). */
static void assert_range_error(em_tensor *r, const char *op, const char *value, const float *want, int n)
{
    assert_non_null(r);
    float got[16];
    em_status st = em_to_host(em_cast(r, EM_F32), got, sizeof(float) * (size_t)n);
    if (em_get_device().kind == EM_DEVICE_CPU) {
        assert_int_equal(st, EM_ERR_INVALID);
        assert_non_null(strstr(em_last_error(), op));
        assert_non_null(strstr(em_last_error(), value));
        assert_non_null(strstr(em_last_error(), "out of range"));
    } else {
        assert_int_equal(st, EM_OK);
        for (int i = 0; i < n; i++) assert_true(got[i] == want[i]);
    }
}

static void test_gather(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *t = F32((2, 2), 1, 2, 3, 4);
    em_tensor *idx = I64((2, 2), 0, 0, 1, 0);
    /* torch.gather(t, 1, [[0,0],[1,0]]) = [[1,1],[4,3]] */
    em_tensor *g1 = em_gather(t, 1, idx);
    ASSERT_SHAPE(g1, 2, 2);
    assert_int_equal(em_tensor_dtype(g1), EM_F32);
    CLOSE(g1, 1, 1, 4, 3);
    /* dim 0: out[i][j] = t[idx[i][j]][j] = [[1,2],[3,2]] */
    CLOSE(em_gather(t, 0, idx), 1, 2, 3, 2);
    CLOSE(em_gather(t, -2, idx), 1, 2, 3, 2);
    /* index smaller than the input; i32 index */
    em_tensor *a = F32((3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9);
    em_tensor *g2 = em_gather(a, 1, I32((2, 1), 2, 0));
    ASSERT_SHAPE(g2, 2, 1);
    CLOSE(g2, 3, 4);
    em_tensor *g3 = em_gather(a, 0, I64((1, 3), 2, 1, 0));
    CLOSE(g3, 7, 5, 3);
    /* strided input (transposed) */
    CLOSE(em_gather(em_transpose(a, 0, 1), 1, I64((2, 2), 0, 2, 1, 1)), 1, 7, 5, 5);
    /* 3-D, dim 2 */
    em_tensor *b = F32((2, 2, 3), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    CLOSE(em_gather(b, 2, I64((2, 2, 1), 2, 0, 1, 2)), 2, 3, 7, 11);
    /* out-of-range and negative indices: an error on the CPU, 0 on CUDA / OpenCL (documented) */
    assert_range_error(em_gather(t, 1, I64((2, 2), 5, 1, -1, 0)), "gather", "index 5", (const float[]){0, 2, 0, 3}, 4);
    assert_range_error(em_gather(t, 1, I64((2, 2), 0, 1, -1, 0)), "gather", "index -1", (const float[]){1, 2, 0, 3}, 4);
    /* integer data */
    em_tensor *ti = I32((2, 3), 10, 20, 30, 40, 50, 60);
    em_tensor *gi = em_gather(ti, 1, I64((2, 2), 2, 1, 0, 0));
    assert_int_equal(em_tensor_dtype(gi), EM_I32);
    CLOSE(gi, 30, 20, 40, 40);
    em_scope_end();
}

static void test_scatter(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *src = F32((2, 5), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10);
    em_tensor *z = em_zeros(SHAPE(3, 5), 2, EM_F32);
    /* PyTorch docs: zeros(3,5).scatter_(0, [[0,1,2,0]], src) */
    em_tensor *s0 = em_scatter(z, 0, I64((1, 4), 0, 1, 2, 0), src);
    ASSERT_SHAPE(s0, 3, 5);
    CLOSE(s0, 1, 0, 0, 4, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0);
    /* zeros(3,5).scatter_(1, [[0,1,2],[0,1,4]], src) */
    em_tensor *s1 = em_scatter(z, 1, I64((2, 3), 0, 1, 2, 0, 1, 4), src);
    CLOSE(s1, 1, 2, 3, 0, 0, 6, 7, 0, 0, 8, 0, 0, 0, 0, 0);
    /* the input is not modified */
    CLOSE(z, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    /* non-zero self, strided self */
    em_tensor *self = F32((2, 2), 1, 2, 3, 4);
    CLOSE(em_scatter(em_transpose(self, 0, 1), 1, I64((1, 2), 1, 0), F32((1, 2), 7, 8)), 8, 7, 2, 4);
    /* src of another dtype: an error at the call (as PyTorch) */
    int64_t sv[2] = {7, 8};
    em_tensor *si = em_from_host(sv, SHAPE(1, 2), 2, EM_I64);
    em_test_assert_error(em_scatter(self, 1, I64((1, 2), 1, 0), si), "em_scatter", "int64", "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_scatter_add(self, 1, I64((1, 2), 1, 0), si), "em_scatter_add", "int64", NULL);
    /* out-of-range indices: an error on the CPU, skipped on CUDA / OpenCL */
    assert_range_error(em_scatter(self, 0, I64((1, 2), 3, -1), src), "scatter", "index 3", (const float[]){1, 2, 3, 4}, 4);
    em_scope_end();
}

static void test_scatter_add(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *ones = em_ones(SHAPE(2, 5), 2, EM_F32);
    em_tensor *z = em_zeros(SHAPE(3, 5), 2, EM_F32);
    /* PyTorch docs: zeros(3,5).scatter_add_(0, [[0,1,2,0,0]], ones(2,5)) */
    CLOSE(em_scatter_add(z, 0, I64((1, 5), 0, 1, 2, 0, 0), ones), 1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0);
    /* ... with index [[0,1,2,0,0],[0,1,2,2,2]] */
    CLOSE(em_scatter_add(z, 0, I64((2, 5), 0, 1, 2, 0, 0, 0, 1, 2, 2, 2), ones), 2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1);
    /* dim 1 with duplicates into a non-zero self */
    em_tensor *a = em_ones(SHAPE(2, 3), 2, EM_F32);
    em_tensor *src = F32((2, 3), 1, 2, 3, 4, 5, 6);
    CLOSE(em_scatter_add(a, 1, I64((2, 3), 0, 0, 2, 1, 1, 1), src), 4, 1, 4, 1, 16, 1);
    /* integer dtype, i32 index */
    em_tensor *ai = I32((4), 0, 0, 0, 0);
    em_tensor *r = em_scatter_add(ai, 0, I32((5), 1, 3, 1, 1, 0), I32((5), 1, 2, 3, 4, 5));
    assert_int_equal(em_tensor_dtype(r), EM_I32);
    CLOSE(r, 5, 8, 0, 2);
    /* an out-of-range index (9 in a dim of 4): an error on the CPU, skipped on CUDA / OpenCL */
    assert_range_error(em_scatter_add(ai, 0, I32((5), 1, 3, 1, 1, 9), I32((5), 1, 2, 3, 4, 5)), "scatter_add", "index 9",
                       (const float[]){0, 8, 0, 2}, 4);
    em_scope_end();
}

static void test_index_select(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    em_tensor *r0 = em_index_select(a, 0, I64((2), 2, 0));
    ASSERT_SHAPE(r0, 2, 4);
    CLOSE(r0, 9, 10, 11, 12, 1, 2, 3, 4);
    em_tensor *r1 = em_index_select(a, 1, I32((3), 3, 1, 1));
    ASSERT_SHAPE(r1, 3, 3);
    CLOSE(r1, 4, 2, 2, 8, 6, 6, 12, 10, 10);
    em_tensor *r2 = em_index_select(em_transpose(a, 0, 1), -1, I64((2), 1, 2));
    ASSERT_SHAPE(r2, 4, 2);
    CLOSE(r2, 5, 9, 6, 10, 7, 11, 8, 12);
    /* strided index (every other element of [2, 9, 0, 9]) */
    CLOSE(em_index_select(a, 0, em_slice(I64((4), 2, 9, 0, 9), 0, 0, 4, 2)), 9, 10, 11, 12, 1, 2, 3, 4);
    /* out-of-range rows: an error on the CPU, zero on CUDA / OpenCL (documented) */
    assert_range_error(em_index_select(a, 0, I64((2), 3, 1)), "index_select", "index 3", (const float[]){0, 0, 0, 0, 5, 6, 7, 8}, 8);
    /* 0-d index picks one row */
    int64_t one = 1;
    ASSERT_SHAPE(em_index_select(a, 0, em_from_host(&one, NULL, 0, EM_I64)), 1, 4);
    em_test_assert_error(em_index_select(a, 0, I64((1, 2), 0, 1)), "em_index_select", "1-D", "[1, 2]", NULL);
    em_scope_end();
}

/* em_index_add against torch.index_add (values worked out by hand) */
static void test_index_add(void **state)
{
    (void)state;
    em_scope_begin();
    /* PyTorch docs: ones(5, 3).index_add_(0, [0, 4, 2], [[1,2,3],[4,5,6],[7,8,9]]) */
    em_tensor *x = em_ones(SHAPE(5, 3), 2, EM_F32);
    em_tensor *t = F32((3, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9);
    em_tensor *r = em_index_add(x, 0, I64((3), 0, 4, 2), t);
    ASSERT_SHAPE(r, 5, 3);
    assert_int_equal(em_tensor_dtype(r), EM_F32);
    CLOSE(r, 2, 3, 4, 1, 1, 1, 8, 9, 10, 1, 1, 1, 5, 6, 7);
    /* dim 1 (= -1), duplicates accumulate, an i32 index: out[:, 0] += src[:, 1];
     * out[:, 2] += src[:, 0] + src[:, 2] + src[:, 3] */
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *src = F32((2, 4), 1, 2, 3, 4, 5, 6, 7, 8);
    CLOSE(em_index_add(a, 1, I32((4), 2, 0, 2, 2), src), 3, 2, 11, 10, 5, 26);
    CLOSE(em_index_add(a, -1, I64((4), 2, 0, 2, 2), src), 3, 2, 11, 10, 5, 26);
    /* a middle dim of a 3-D tensor: out[i][1][k] = src[i][0][k] + src[i][1][k] */
    em_tensor *r3 = em_index_add(em_zeros(SHAPE(2, 3, 2), 3, EM_F32), 1, I64((2), 1, 1), F32((2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8));
    ASSERT_SHAPE(r3, 2, 3, 2);
    CLOSE(r3, 0, 0, 4, 6, 0, 0, 0, 0, 12, 14, 0, 0);
    /* ascending j on every device: in f32, (0 + 1) + 1e8 rounds to 1e8, then
     * - 1e8 gives 0 (another order, e.g. 1e8 - 1e8 first, would give 1) */
    CLOSE(em_index_add(F32((1), 0), 0, I64((3), 0, 0, 0), F32((3), 1, 1e8f, -1e8f)), 0);
    /* strided self and src (transposed views), and a strided index
     * (every other element of [1, 7, 0, 7]) */
    em_tensor *st = em_transpose(F32((3, 2), 1, 4, 2, 5, 3, 6), 0, 1);       /* [[1,2,3],[4,5,6]] */
    em_tensor *ss = em_transpose(F32((2, 2), 10, 30, 20, 40), 0, 1);          /* [[10,20],[30,40]] */
    em_tensor *si = em_slice(I64((4), 1, 7, 0, 7), 0, 0, 4, 2);               /* [1, 0] */
    CLOSE(em_index_add(st, 1, si, ss), 21, 12, 3, 44, 35, 6);
    /* integer and bool dtypes (bool: logical or) */
    em_tensor *ri = em_index_add(T(EM_I64, (3), 0, 0, 0), 0, I64((3), 2, 2, 0), T(EM_I64, (3), 5, 6, 7));
    assert_int_equal(em_tensor_dtype(ri), EM_I64);
    CLOSE(ri, 7, 0, 11);
    em_tensor *rb = em_index_add(T(EM_BOOL, (3), 0, 1, 0), 0, I64((2), 0, 0), T(EM_BOOL, (2), 0, 1));
    assert_int_equal(em_tensor_dtype(rb), EM_BOOL);
    CLOSE(rb, 1, 1, 0);
    /* f64 */
    CLOSE(em_index_add(F64((2), 0.5, 0.25), 0, I64((2), 1, 1), F64((2), 1, 2)), 0.5, 3.25);
    /* a 0-d index adds one slice; an empty index leaves self */
    int64_t one = 1;
    CLOSE(em_index_add(a, 0, em_from_host(&one, NULL, 0, EM_I64), F32((1, 3), 1, 1, 1)), 1, 2, 3, 5, 6, 7);
    em_tensor *r0 = em_index_add(a, 0, em_zeros(SHAPE(0), 1, EM_I64), em_zeros(SHAPE(0, 3), 2, EM_F32));
    ASSERT_SHAPE(r0, 2, 3);
    CLOSE(r0, 1, 2, 3, 4, 5, 6);
    /* an out-of-range index (3 in a dim of 2, and -1): an error on the CPU,
     * skipped on CUDA / OpenCL (as scatter_add) */
    assert_range_error(em_index_add(a, 0, I64((3), 3, 1, -1), F32((3, 3), 1, 1, 1, 2, 2, 2, 3, 3, 3)), "index_add", "index 3",
                       (const float[]){1, 2, 3, 6, 7, 8}, 6);
    /* errors at the call */
    em_test_assert_error(em_index_add(NULL, 0, I64((1), 0), a), "em_index_add", "self", "NULL", NULL);
    em_test_assert_error(em_index_add(a, 0, NULL, a), "em_index_add", "index", "NULL", NULL);
    em_test_assert_error(em_index_add(a, 0, I64((1), 0), NULL), "em_index_add", "src", "NULL", NULL);
    em_test_assert_error(em_index_add(a, 2, I64((2), 0, 1), a), "em_index_add", "dim 2", NULL);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    em_test_assert_error(em_index_add(a, 0, F32((2), 0, 1), a), "em_index_add", "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_index_add(a, 0, I64((2), 0, 1), T(EM_F64, (2, 3), 1, 2, 3, 4, 5, 6)), "em_index_add", "float64",
                         "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_index_add(a, 0, I64((1, 2), 0, 1), a), "em_index_add", "1-D", "[1, 2]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    /* src's dim must be the index's length, its other dims self's */
    em_test_assert_error(em_index_add(a, 0, I64((3), 0, 1, 1), a), "em_index_add", "[2, 3]", "length 3", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_index_add(a, 0, I64((1), 0), F32((1, 2), 1, 2)), "em_index_add", "[1, 2]", "[2, 3]", NULL);
    em_test_assert_error(em_index_add(a, 0, I64((2), 0, 1), F32((6), 1, 2, 3, 4, 5, 6)), "em_index_add", "[6]", NULL);
    float f = 1;
    em_tensor *s0 = em_from_host(&f, NULL, 0, EM_F32);
    em_test_assert_error(em_index_add(s0, 0, I64((1), 0), s0), "em_index_add", "at least one dim", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_scope_end();
}

static void test_one_hot(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *o = em_one_hot(I64((3), 0, 2, 1), 3);
    ASSERT_SHAPE(o, 3, 3);
    assert_int_equal(em_tensor_dtype(o), EM_I64);
    CLOSE(o, 1, 0, 0, 0, 0, 1, 0, 1, 0);
    em_tensor *o2 = em_one_hot(I32((2, 1), 1, 2), 3);
    ASSERT_SHAPE(o2, 2, 1, 3);
    CLOSE(o2, 0, 1, 0, 0, 0, 1);
    /* 3 is out of range: an error on the CPU, an all-zero row on CUDA / OpenCL */
    assert_range_error(em_one_hot(I32((2, 1), 1, 3), 3), "one_hot", "num_classes 3", (const float[]){0, 1, 0, 0, 0, 0}, 6);
    em_tensor *o3 = em_one_hot(em_transpose(I64((2, 2), 0, 1, 2, 3), 0, 1), 4);
    CLOSE(o3, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1);
    em_test_assert_error(em_one_hot(I64((2), 0, 1), 0), "em_one_hot", "num_classes", NULL);
    em_test_assert_error(em_one_hot(F32((2), 0, 1), 2), "em_one_hot", "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_scope_end();
}

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *idx = I64((2, 2), 0, 1, 1, 0);
    em_tensor *fidx = F32((2, 2), 0, 1, 1, 0);
    /* wrong index dtype */
    em_test_assert_error(em_gather(a, 1, fidx), "em_gather", "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_scatter(a, 1, fidx, a), "em_scatter", "float32", NULL);
    em_test_assert_error(em_scatter_add(a, 1, fidx, a), "em_scatter_add", "float32", NULL);
    em_test_assert_error(em_index_select(a, 0, F32((1), 0)), "em_index_select", "float32", NULL);
    /* NULL inputs */
    em_test_assert_error(em_gather(NULL, 0, idx), "em_gather", "NULL", NULL);
    em_test_assert_error(em_gather(a, 0, NULL), "em_gather", "NULL", NULL);
    em_test_assert_error(em_scatter(a, 0, idx, NULL), "em_scatter", "NULL", NULL);
    em_test_assert_error(em_index_select(NULL, 0, idx), "NULL", NULL);
    em_test_assert_error(em_one_hot(NULL, 3), "NULL", NULL);
    /* bad dim */
    em_test_assert_error(em_gather(a, 2, idx), "em_gather", "dim 2", NULL);
    em_test_assert_error(em_scatter_add(a, -3, idx, a), "em_scatter_add", "dim -3", NULL);
    em_test_assert_error(em_index_select(a, 5, I64((1), 0)), "em_index_select", "dim 5", NULL);
    /* shapes */
    em_test_assert_error(em_gather(a, 1, I64((3), 0, 1, 2)), "em_gather", "[3]", "[2, 3]", NULL);
    em_test_assert_error(em_gather(a, 1, I64((3, 1), 0, 1, 2)), "em_gather", "[3, 1]", "dim 0", NULL);
    em_test_assert_error(em_scatter(a, 1, I64((2, 4), 0, 0, 0, 0, 0, 0, 0, 0), a), "em_scatter", "[2, 4]", "src", NULL);
    em_test_assert_error(em_one_hot(em_zeros(SHAPE(1, 1, 1, 1, 1, 1, 1, 2), 8, EM_I64), 3), "em_one_hot", "rank 9", NULL);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_scatter),
        cmocka_unit_test(test_scatter_add),
        cmocka_unit_test(test_index_select),
        cmocka_unit_test(test_index_add),
        cmocka_unit_test(test_one_hot),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
