/* Helpers shared by the cmocka tests. */
#ifndef EMBER_TESTUTIL_H
#define EMBER_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ember/ember.h"

/* cmocka group setup/teardown that start and stop the runtime. */
/* The devices a test runs on: the CPU first, then every CUDA and OpenCL
 * device with a worker (up to @p max in all); the current device is the CPU
 * afterwards. Returns the count. */
typedef struct em_test_dev {
    em_device d;
    char name[32]; /* "cpu", "cuda:0", ... */
} em_test_dev;
int em_test_list_devices(em_test_dev *devs, int max);

/* Waits for the tasks (em_sync) and fails the test when the live tensors or
 * StarPU handles differ from @p before (an em_get_stats() taken earlier). */
void em_test_assert_no_leak(const em_stats *before);

int em_test_setup(void **state);
int em_test_teardown(void **state);

/* The same plus a fresh temporary directory, removed with its contents. */
int em_test_setup_tmpdir(void **state);
int em_test_teardown_tmpdir(void **state);
const char *em_test_tmp_dir(void);
/* "<tmpdir>/<name>" in one of 4 rotating static buffers. */
char *em_test_tmp_path(const char *name);

/* Reads t (any dtype) into a malloc'd double array; fails the test on error. */
double *em_test_values(const em_tensor *t);
/* Asserts shape equality. */
void em_test_assert_shape(const em_tensor *t, int ndim, const int64_t *shape);
/* Asserts |t[i] - want[i]| <= atol + rtol*|want[i]| for all i (shape must match numel n). */
void em_test_assert_close(const em_tensor *t, const double *want, int64_t n, double rtol, double atol);
/* Fails (naming @p what) unless t is non-NULL with dtype dt. */
void em_test_check_dtype(const em_tensor *t, em_dtype dt, const char *what);
/* Checks dtype, numel and values of r (tolerances as em_test_assert_close),
 * then releases r. */
void em_test_expect(em_tensor *r, em_dtype dt, const double *want, int64_t n, double rtol, double atol, const char *what);
/* Asserts that an op returned NULL and the error message contains all the given substrings (NULL-terminated). */
void em_test_assert_error(const em_tensor *r, ...);
/* f32 tensor from a literal list. */
em_tensor *em_test_f32(const float *v, const int64_t *shape, int ndim);
em_tensor *em_test_f64(const double *v, const int64_t *shape, int ndim);
/* Tensor of dtype dt from double values (converted element by element). */
em_tensor *em_test_make(em_dtype dt, const double *v, const int64_t *shape, int ndim);

/* A deterministic classification batch from @p seed: x [n, features] uniform
 * in [-1, 1), y [n] class indices in [0, classes) (a 64-bit LCG, the same on
 * every machine and rank). */
void em_test_class_batch(uint64_t seed, int64_t n, int64_t features, int64_t classes, float *x, int64_t *y);
/* Max |a - b| over the parameters of two models of the same layout
 * (INFINITY when their parameter counts differ). */
double em_test_max_param_diff(const em_module *a, const em_module *b);

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define F32(shape_list, ...) em_test_f32((const float[]){__VA_ARGS__}, SHAPE shape_list, NDIM shape_list)
#define F64(shape_list, ...) em_test_f64((const double[]){__VA_ARGS__}, SHAPE shape_list, NDIM shape_list)
#define T(dt, shape_list, ...) em_test_make(dt, (const double[]){__VA_ARGS__}, SHAPE shape_list, NDIM shape_list)
#define VALS(...) ((const double[]){__VA_ARGS__}), ((int64_t)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))

#endif
