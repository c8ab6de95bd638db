/* Convolution and pooling ops: hand-computed values (the PyTorch fixtures of
 * test_grad_pytorch cover the settings in f64), f32 results, max-pool
 * indices, and the errors a user gets for bad input — each message names the
 * shapes or settings at fault. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void test_conv2d_values(void **state)
{
    (void)state;
    em_scope_begin();
    /* x = 1..9 in a 3x3 plane, w = [[1, 0], [0, 1]]: y = x[i][j] + x[i+1][j+1], + bias 10 */
    em_tensor *x = em_test_f32((const float[]){1, 2, 3, 4, 5, 6, 7, 8, 9}, (const int64_t[]){1, 1, 3, 3}, 4);
    em_tensor *w = em_test_f32((const float[]){1, 0, 0, 1}, (const int64_t[]){1, 1, 2, 2}, 4);
    em_tensor *b = em_test_f32((const float[]){10}, (const int64_t[]){1}, 1);
    em_tensor *y = em_conv2d(x, w, b, NULL);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 2});
    em_test_assert_close(y, (const double[]){16, 18, 22, 24}, 4, 0, 0);
    /* padding 1, stride 2: corners of the padded 4x4 output grid */
    em_conv_opts o = em_conv_opts_default();
    o.padding[0] = o.padding[1] = 1, o.stride[0] = o.stride[1] = 2;
    y = em_conv2d(x, w, NULL, &o);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 2});
    em_test_assert_close(y, (const double[]){1, 3, 7, 14}, 4, 0, 0);
    /* padding='same' with an even kernel pads the extra row/column at the end */
    em_conv_opts s = em_conv_opts_default();
    s.padding_same = true;
    y = em_conv2d(x, w, NULL, &s);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 3, 3});
    em_test_assert_close(y, (const double[]){6, 8, 3, 12, 14, 6, 7, 8, 9}, 9, 0, 0);
    em_scope_end();
}

static void test_conv_transpose_values(void **state)
{
    (void)state;
    em_scope_begin();
    /* stride 2 scatters each input pixel times the 2x2 kernel into its own block */
    em_tensor *x = em_test_f32((const float[]){1, 2}, (const int64_t[]){1, 1, 1, 2}, 4);
    em_tensor *w = em_test_f32((const float[]){1, 2, 3, 4}, (const int64_t[]){1, 1, 2, 2}, 4);
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = o.stride[1] = 2;
    em_tensor *y = em_conv_transpose2d(x, w, NULL, &o);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 4});
    em_test_assert_close(y, (const double[]){1, 2, 2, 4, 3, 4, 6, 8}, 8, 0, 0);
    o.output_padding[1] = 1;
    y = em_conv_transpose2d(x, w, NULL, &o);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 5});
    em_test_assert_close(y, (const double[]){1, 2, 2, 4, 0, 3, 4, 6, 8, 0}, 10, 0, 0);
    em_scope_end();
}

static void test_pool_values(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = em_test_f32((const float[]){1, 5, 2, 0, 3, 4, 9, 9, 7, 8, 6, 1, 0, 2, 3, 4},
                               (const int64_t[]){1, 1, 4, 4}, 4);
    em_pool_opts o = em_pool_opts_default(2, 2);
    em_tensor *idx = NULL;
    em_tensor *y = em_max_pool2d(x, &o, &idx);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 2});
    em_test_assert_close(y, (const double[]){5, 9, 8, 6}, 4, 0, 0);
    em_test_check_dtype(idx, EM_I64, "max_pool2d indices");
    /* ties (9, 9) keep the first; indices are h * W + w */
    em_test_assert_close(idx, (const double[]){1, 6, 9, 10}, 4, 0, 0);
    y = em_avg_pool2d(x, &o);
    em_test_assert_close(y, (const double[]){13 / 4.0, 20 / 4.0, 17 / 4.0, 14 / 4.0}, 4, 1e-7, 0);
    /* padding 1, count_include_pad false: corner windows average their one pixel */
    em_pool_opts p = em_pool_opts_default(2, 2);
    p.padding[0] = p.padding[1] = 1, p.count_include_pad = false;
    y = em_avg_pool2d(x, &p);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 3, 3});
    double *v = em_test_values(y);
    assert_true(v[0] == 1 && v[2] == 0 && v[6] == 0 && v[8] == 4);
    free(v);
    /* ceil_mode keeps a partial last window */
    em_pool_opts c = em_pool_opts_default(3, 3);
    c.stride[0] = c.stride[1] = 2, c.ceil_mode = true;
    y = em_max_pool2d(x, &c, NULL);
    em_test_assert_shape(y, 4, (const int64_t[]){1, 1, 2, 2});
    em_test_assert_close(y, (const double[]){9, 9, 8, 6}, 4, 0, 0); /* torch.nn.functional.max_pool2d(x, 3, 2, ceil_mode=True) */
    y = em_adaptive_avg_pool2d(x, 1, 1);
    em_test_assert_close(y, (const double[]){64 / 16.0}, 1, 1e-7, 0);
    em_scope_end();
}

static void test_bad_input(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = em_zeros((const int64_t[]){2, 3, 5, 5}, 4, EM_F32);
    em_tensor *w = em_zeros((const int64_t[]){4, 3, 7, 7}, 4, EM_F32);
    em_test_assert_error(em_conv2d(x, w, NULL, NULL), "larger than the padded input", "[2, 3, 5, 5]", "[4, 3, 7, 7]", NULL);
    em_conv_opts g = em_conv_opts_default();
    g.groups = 2;
    em_tensor *w2 = em_zeros((const int64_t[]){4, 1, 3, 3}, 4, EM_F32);
    em_test_assert_error(em_conv2d(x, w2, NULL, &g), "groups=2", "[2, 3, 5, 5]", NULL);
    em_tensor *x3 = em_zeros((const int64_t[]){3, 5, 5}, 3, EM_F32);
    em_tensor *w3 = em_zeros((const int64_t[]){4, 3, 3, 3}, 4, EM_F32);
    em_test_assert_error(em_conv2d(x3, w3, NULL, NULL), "[N, C, H, W]", "[3, 5, 5]", NULL);
    em_tensor *bias = em_zeros((const int64_t[]){5}, 1, EM_F32);
    em_test_assert_error(em_conv2d(x, w3, bias, NULL), "bias", "[5]", NULL);
    em_tensor *wi = em_zeros((const int64_t[]){4, 3, 3, 3}, 4, EM_I64);
    em_test_assert_error(em_conv2d(x, wi, NULL, NULL), "float", NULL);
    em_conv_opts st = em_conv_opts_default();
    st.stride[0] = 0;
    em_test_assert_error(em_conv2d(x, w3, NULL, &st), "stride", NULL);
    em_conv_opts same = em_conv_opts_default();
    same.padding_same = true, same.stride[1] = 2;
    em_test_assert_error(em_conv2d(x, w3, NULL, &same), "padding='same'", NULL);
    em_conv_opts op = em_conv_opts_default();
    op.output_padding[0] = 1;
    em_tensor *wt = em_zeros((const int64_t[]){3, 2, 3, 3}, 4, EM_F32);
    em_test_assert_error(em_conv_transpose2d(x, wt, NULL, &op), "output_padding", NULL);
    /* pooling: kernel larger than the padded input (zero-size output), padding > kernel/2, wrong rank */
    em_pool_opts big = em_pool_opts_default(7, 7);
    em_test_assert_error(em_max_pool2d(x, &big, NULL), "empty", "[2, 3, 5, 5]", NULL);
    em_pool_opts pad = em_pool_opts_default(2, 2);
    pad.padding[0] = 2;
    em_test_assert_error(em_avg_pool2d(x, &pad), "half of kernel_size", NULL);
    em_pool_opts two = em_pool_opts_default(2, 2);
    em_test_assert_error(em_max_pool2d(x3, &two, NULL), "[N, C, H, W]", "[3, 5, 5]", NULL);
    em_test_assert_error(em_adaptive_avg_pool2d(x, 0, 3), "output size", NULL);
    em_pool_opts dv = em_pool_opts_default(2, 2);
    dv.divisor_override = -1;
    em_test_assert_error(em_avg_pool2d(x, &dv), "divisor_override", NULL);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_values),
        cmocka_unit_test(test_conv_transpose_values),
        cmocka_unit_test(test_pool_values),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
