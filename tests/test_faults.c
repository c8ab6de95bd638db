/* The error policy (DESIGN.md §10) under fault injection: a kernel that fails
 * on a worker becomes the sticky error that the next em_sync / em_to_host /
 * em_item returns, naming the op, the device and the shapes, and the program
 * goes on; an allocation that fails inside autodiff makes the op or
 * em_backward return an error, never a silently missing gradient.
 *
 * The device under test is EMBER_FAULTS_DEVICE (default cpu). CTest runs this
 * program three times: on the CPU, on PoCL as opencl:0 (test_faults_opencl,
 * where a missing OpenCL worker fails), and on cuda:0 (test_faults_cuda,
 * which exits 77, reported by CTest as skipped, where there is no CUDA
 * device). Nothing here runs inside a StarPU worker: the checks read results
 * on the main thread. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* runtime/fault.c: re-arms fault injection. */
em_status em__fault_inject(const char *spec); /* not exported: this test links ember_objs */

static em_device g_dev;
static char g_dev_name[32]; /* "cpu", "opencl:0", "cuda:0" as the messages write it */

static int setup(void **state)
{
    if (em_test_setup(state) != 0) return -1;
    if (em_set_device(g_dev) != EM_OK) {
        fprintf(stderr, "em_set_device: %s\n", em_last_error());
        return -1;
    }
    return 0;
}

static void assert_msg_has(const char *msg, const char *part)
{
    if (!strstr(msg, part)) fail_msg("error message \"%s\" lacks \"%s\"", msg, part);
}

/* Arms kernel:n after everything submitted so far has run. */
static void arm(const char *spec)
{
    assert_int_equal(em_sync(), EM_OK);
    assert_int_equal(em__fault_inject(spec), EM_OK);
}

static em_tensor *input23(void) { return F32((2, 3), 1, -2, 3, -4, 5, -6); }

static void test_spec(void **state)
{
    (void)state;
    assert_int_equal(em__fault_inject("bogus:1"), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "bogus:1"));
    assert_int_equal(em__fault_inject("kernel:0"), EM_ERR_INVALID);
    assert_int_equal(em__fault_inject("kernel:2,alloc"), EM_ERR_INVALID);
    assert_int_equal(em__fault_inject("kernel:2,node:1"), EM_OK);
    assert_int_equal(em__fault_inject(""), EM_OK);
    assert_int_equal(em__fault_inject(NULL), EM_OK);
}

/* The failure reaches em_sync, once; the next op works. */
static void test_kernel_sync(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = input23();
    arm("kernel:1");
    em_tensor *y = em_exp(x);
    assert_non_null(y); /* submission succeeded: the kernel fails later, on its worker */
    assert_int_equal(em_sync(), EM_ERR_DEVICE);
    assert_int_equal(em_last_status(), EM_ERR_DEVICE);
    const char *m = em_last_error();
    print_message("em_sync after an injected failure: %s\n", m);
    assert_msg_has(m, "em_sync: ");
    assert_msg_has(m, "op exp on ");
    assert_msg_has(m, g_dev_name);
    assert_msg_has(m, "(worker ");
    assert_msg_has(m, "inputs: [2, 3] float32");
    assert_msg_has(m, "outputs: [2, 3] float32");
    assert_msg_has(m, "injected fault");
    /* cleared: the program goes on */
    assert_int_equal(em_sync(), EM_OK);
    em_test_expect(em_add(x, x), EM_F32, VALS(2, -4, 6, -8, 10, -12), 0, 0, "add after the failure");
    em_scope_end();
}

/* The Nth kernel fails, in a chain: the message names that op. */
/* Kernel numbers count tasks: with element-wise fusion on, neg, abs and
 * mul_scalar would be one FUSED kernel, so the numbered tests below run with
 * fusion off (test_kernel_fused covers a failing fused chain). */
static void test_kernel_nth(void **state)
{
    (void)state;
    const bool fusion = em_set_fusion(false);
    em_scope_begin();
    em_tensor *x = input23();
    arm("kernel:3");
    em_tensor *a = em_neg(x);                 /* kernel 1 */
    em_tensor *b = em_abs(a);                 /* kernel 2 */
    em_tensor *c = em_mul_scalar(b, 2.0);     /* kernel 3: fails */
    em_tensor *d = em_sum(c, NULL, 0, false); /* kernel 4: runs on undefined values */
    assert_non_null(d);
    double v = 0;
    assert_int_equal(em_item(d, &v), EM_ERR_DEVICE);
    const char *m = em_last_error();
    print_message("em_item after kernel:3: %s\n", m);
    assert_msg_has(m, "em_item: ");
    assert_msg_has(m, "op mul_scalar on ");
    assert_msg_has(m, g_dev_name);
    /* the same chain again is right */
    em_tensor *e = em_sum(em_mul_scalar(em_abs(em_neg(x)), 2.0), NULL, 0, false);
    assert_int_equal(em_item(e, &v), EM_OK);
    assert_true(fabs(v - 42.0) < 1e-5);
    em_scope_end();
    em_set_fusion(fusion);
}

/* A failing fused chain (fusion on): the error names the FUSED op and its
 * shape, the chain's result is not used, the same chain again is right. */
static void test_kernel_fused(void **state)
{
    (void)state;
    const bool fusion = em_set_fusion(true);
    em_scope_begin();
    em_tensor *x = input23();
    const int64_t fused0 = em_get_stats().fused_tasks;
    arm("kernel:1");
    em_tensor *c = em_mul_scalar(em_abs(em_neg(x)), 2.0); /* one FUSED kernel: fails */
    double v = 0;
    assert_int_equal(em_item(em_sum(c, NULL, 0, false), &v), EM_ERR_DEVICE);
    const char *m = em_last_error();
    print_message("em_item after a failed fused chain: %s\n", m);
    assert_msg_has(m, "op fused on ");
    assert_msg_has(m, g_dev_name);
    assert_true(em_get_stats().fused_tasks > fused0);
    assert_int_equal(em_item(em_sum(em_mul_scalar(em_abs(em_neg(x)), 2.0), NULL, 0, false), &v), EM_OK);
    assert_true(fabs(v - 42.0) < 1e-5);
    em_scope_end();
    em_set_fusion(fusion);
}

/* em_to_host and em_item return it too, naming the shapes of the op. */
static void test_kernel_to_host_item(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = input23();
    float buf[6];
    arm("kernel:1");
    em_tensor *y = em_mul(x, x);
    assert_int_equal(em_to_host(y, buf, sizeof buf), EM_ERR_DEVICE);
    const char *m = em_last_error();
    print_message("em_to_host: %s\n", m);
    assert_msg_has(m, "em_to_host: op mul on ");
    assert_msg_has(m, g_dev_name);
    assert_msg_has(m, "inputs: [2, 3] float32, [2, 3] float32");
    assert_int_equal(em_to_host(em_mul(x, x), buf, sizeof buf), EM_OK);
    assert_true(buf[5] == 36.0f);

    arm("kernel:1");
    em_tensor *s = em_sum(x, NULL, 0, false);
    double v = 0;
    assert_int_equal(em_item(s, &v), EM_ERR_DEVICE);
    m = em_last_error();
    print_message("em_item: %s\n", m);
    assert_msg_has(m, "em_item: op sum on ");
    assert_msg_has(m, "inputs: [2, 3] float32; outputs: [] float32");
    assert_int_equal(em_item(em_sum(x, NULL, 0, false), &v), EM_OK);
    assert_true(fabs(v + 3.0) < 1e-6);
    em_scope_end();
}

/* Two failures before a read: the first is reported, the second counted. */
static void test_kernel_two_failures(void **state)
{
    (void)state;
    const bool fusion = em_set_fusion(false); /* kernel numbers count ops one by one */
    em_scope_begin();
    em_tensor *x = input23();
    arm("kernel:1");
    assert_non_null(em_exp(x));
    assert_int_equal(em_sync(), EM_ERR_DEVICE);
    arm("kernel:2");
    em_tensor *a = em_tanh(x);
    em_tensor *b = em_sigmoid(a); /* fails */
    assert_non_null(b);
    assert_int_equal(em_sync(), EM_ERR_DEVICE);
    assert_msg_has(em_last_error(), "op sigmoid on ");
    assert_int_equal(em_sync(), EM_OK);
    em_scope_end();
    em_set_fusion(fusion);
}

/* A failing matmul (its own tiling submitter) and a failing optimizer-style
 * in-place op name themselves too. */
static void test_kernel_matmul(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = input23();
    em_tensor *b = F32((3, 2), 1, 2, 3, 4, 5, 6);
    arm("kernel:1");
    em_tensor *c = em_matmul(a, b);
    assert_non_null(c);
    assert_int_equal(em_sync(), EM_ERR_DEVICE);
    const char *m = em_last_error();
    print_message("matmul: %s\n", m);
    assert_msg_has(m, "op matmul on ");
    assert_msg_has(m, "outputs: [2, 2] float32");
    em_test_expect(em_matmul(a, b), EM_F32, VALS(10, 12, -19, -24), 1e-6, 1e-6, "matmul after the failure");
    em_scope_end();
}

/* An autodiff node that cannot be allocated fails the op (NULL + error), not
 * the gradient silently. */
static void test_autodiff_node(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = input23();
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    arm("node:1");
    em_tensor *y = em_mul(x, x);
    assert_null(y);
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    print_message("op with its node failing: %s\n", em_last_error());
    assert_msg_has(em_last_error(), "op mul");
    assert_msg_has(em_last_error(), "autodiff");
    /* a chain fails once (NULL in, NULL out) */
    assert_null(em_sum(y, NULL, 0, false));

    arm("node:2");
    em_tensor *a = em_exp(x);
    assert_non_null(a);
    assert_null(em_sum(a, NULL, 0, false));
    assert_msg_has(em_last_error(), "op sum");

    arm(""); /* disarmed: the gradient is there */
    em_tensor *loss = em_sum(em_mul(x, x), NULL, 0, false);
    em_grads *g = em_backward(loss);
    assert_non_null(g);
    em_test_expect(em_tensor_retain(em_grad(g, x)), EM_F32, VALS(2, -4, 6, -8, 10, -12), 1e-6, 1e-6, "d(x*x)/dx");
    em_grads_free(g);
    /* concatenation records its own node */
    arm("node:1");
    em_tensor *parts[2] = {x, x};
    assert_null(em_cat(parts, 2, 0));
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    assert_msg_has(em_last_error(), "op cat");
    arm("");
    em_scope_end();
}

/* Every tracked allocation of a small forward + backward fails in turn: each
 * run either fails with an error (from an op or em_backward) or gives the
 * right gradient; nothing crashes, nothing leaks. */
static void test_alloc_sweep(void **state)
{
    (void)state;
    em_tensor *x = input23();
    em_tensor *w = F32((2, 3), 0.5, 1, -1, 2, 0.25, -0.5);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    em_keep(x);
    em_keep(w);
    assert_int_equal(em_sync(), EM_OK);
    const int64_t live0 = em_get_stats().live_tensors;
    int failed_forward = 0, failed_backward = 0, passed = 0, n;
    for (n = 1; n <= 200; n++) {
        char spec[32];
        snprintf(spec, sizeof spec, "alloc:%d", n);
        assert_int_equal(em__fault_inject(spec), EM_OK);
        em_scope_begin();
        em_clear_error();
        em_tensor *t = em_tanh(x);
        em_tensor *p = em_mul(t, w);
        em_tensor *loss = em_mean(p, NULL, 0, false);
        em_grads *g = NULL;
        /* an injected allocation failure is reported as such, also through
         * the later ops of the chain that got its NULL */
        if (!loss) {
            if (em_last_status() != EM_ERR_NOMEM) fail_msg("alloc:%d: forward failed with %s", n, em_last_error());
            failed_forward++;
        } else if (!(g = em_backward(loss))) {
            if (em_last_status() != EM_ERR_NOMEM) fail_msg("alloc:%d: em_backward failed with %s", n, em_last_error());
            failed_backward++;
        } else {
            em_tensor *gx = em_grad(g, x);
            if (!gx) fail_msg("alloc:%d: em_backward succeeded without a gradient for x", n);
            double *v = em_test_values(gx);
            const double xs[6] = {1, -2, 3, -4, 5, -6}, ws[6] = {0.5, 1, -1, 2, 0.25, -0.5};
            for (int i = 0; i < 6; i++) {
                double th = tanh(xs[i]), want = ws[i] * (1 - th * th) / 6.0;
                if (fabs(v[i] - want) > 1e-6) fail_msg("alloc:%d: gradient %d is %g, expected %g", n, i, v[i], want);
            }
            free(v);
            em_grads_free(g);
            passed++;
        }
        em_scope_end();
        assert_int_equal(em_sync(), EM_OK);
        if (em_get_stats().live_tensors != live0)
            fail_msg("alloc:%d: %lld tensors alive, %lld before", n, (long long)em_get_stats().live_tensors, (long long)live0);
        if (passed >= 3) break; /* past the last allocation of the step */
    }
    assert_int_equal(em__fault_inject(""), EM_OK);
    print_message("alloc sweep: %d runs failed in the forward pass, %d in em_backward, then %d passed\n", failed_forward,
                  failed_backward, passed);
    assert_true(failed_forward > 0);
    assert_true(failed_backward > 0);
    assert_int_equal(passed, 3);
    em_tensor_release(x);
    em_tensor_release(w);
}

/* An op whose operands alone exceed the device's memory fails at submission
 * (StarPU would wait for the memory forever). CTest limits the device to
 * 32 MiB (STARPU_LIMIT_OPENCL_MEM / STARPU_LIMIT_CUDA_MEM). */
static void test_device_oom(void **state)
{
    (void)state;
    if (g_dev.kind == EM_DEVICE_CPU) {
        print_message("SKIPPED: device memory limits need an accelerator (EMBER_FAULTS_DEVICE=opencl:0 / cuda:0)\n");
        skip();
    }
    const char *lim = getenv(g_dev.kind == EM_DEVICE_CUDA ? "STARPU_LIMIT_CUDA_MEM" : "STARPU_LIMIT_OPENCL_MEM");
    if (!lim || atoi(lim) <= 0 || atoi(lim) > 32) {
        print_message("SKIPPED: no device memory limit of at most 32 MiB set for this run\n");
        skip();
    }
    em_scope_begin();
    const int64_t n = 12 << 20; /* 48 MiB of f32 */
    em_tensor *big = em_zeros(&n, 1, EM_F32);
    assert_null(big);
    assert_int_equal(em_last_status(), EM_ERR_NOMEM);
    const char *m = em_last_error();
    print_message("too big for the device: %s\n", m);
    assert_msg_has(m, "op fill on ");
    assert_msg_has(m, g_dev_name);
    assert_msg_has(m, "device memory");
    assert_msg_has(m, "outputs: [12582912] float32");
    assert_int_equal(em_sync(), EM_OK);
    em_test_expect(em_add(input23(), input23()), EM_F32, VALS(2, -4, 6, -8, 10, -12), 0, 0, "add after the failure");
    em_scope_end();
}

int main(void)
{
    const char *dev = getenv("EMBER_FAULTS_DEVICE");
    if (!dev || !*dev) dev = "cpu";
    if (em_device_parse(dev, &g_dev) != EM_OK) {
        fprintf(stderr, "test_faults: EMBER_FAULTS_DEVICE: %s\n", em_last_error());
        return 1;
    }
    if (g_dev.kind == EM_DEVICE_CPU)
        snprintf(g_dev_name, sizeof g_dev_name, "cpu (worker ");
    else
        em_device_str(g_dev, g_dev_name, sizeof g_dev_name);
    if (g_dev.kind == EM_DEVICE_CUDA) { /* skipped (exit 77), and says so, where there is no GPU */
        em_config c = em_config_default();
        int n = em_init(&c) == EM_OK ? em_device_count(EM_DEVICE_CUDA) : 0;
        em_shutdown();
        if (n <= g_dev.index) {
            printf("test_faults: SKIPPED: no CUDA device %s in this process (%s)\n", dev, n ? "too few" : "none");
            return 77;
        }
    }
    /* OpenCL: a missing device fails in setup (em_set_device), it is not skipped */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_kernel_sync),
        cmocka_unit_test(test_kernel_nth),
        cmocka_unit_test(test_kernel_fused),
        cmocka_unit_test(test_kernel_to_host_item),
        cmocka_unit_test(test_kernel_two_failures),
        cmocka_unit_test(test_kernel_matmul),
        cmocka_unit_test(test_autodiff_node),
        cmocka_unit_test(test_alloc_sweep),
        cmocka_unit_test(test_device_oom),
    };
    printf("test_faults on %s\n", dev);
    return cmocka_run_group_tests(tests, setup, em_test_teardown);
}
