/* Creation ops: each is one fill task on a fresh (pooled) storage. */
#include "tasks/tasks_internal.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static em_tensor *fill_op(enum em_op_kind kind, const int64_t *shape, int ndim, em_dtype dt, const union em_op_params *p)
{
    em_tensor *out = em__tensor_new(dt, shape, ndim);
    if (!out) return NULL;
    return em__run1(kind, NULL, 0, out, p, NULL);
}

em_tensor *em_full(const int64_t *shape, int ndim, em_dtype dt, double value)
{
    union em_op_params p = {.s = {.a = value}};
    return fill_op(EM_OP_FILL, shape, ndim, dt, &p);
}

em_tensor *em_empty(const int64_t *shape, int ndim, em_dtype dt)
{
    /* Initialised to zero: an uninitialised StarPU handle cannot be read. */
    return em_full(shape, ndim, dt, 0.0);
}
em_tensor *em_zeros(const int64_t *shape, int ndim, em_dtype dt) { return em_full(shape, ndim, dt, 0.0); }
em_tensor *em_ones(const int64_t *shape, int ndim, em_dtype dt) { return em_full(shape, ndim, dt, 1.0); }

em_tensor *em_full_like(const em_tensor *t, double value)
{
    if (!t) return em__fail_null("em_full_like: input is NULL");
    return em_full(t->shape, t->ndim, t->dtype, value);
}
em_tensor *em_zeros_like(const em_tensor *t) { return em_full_like(t, 0.0); }
em_tensor *em_ones_like(const em_tensor *t) { return em_full_like(t, 1.0); }
em_tensor *em_scalar(double value, em_dtype dt) { return em_full(NULL, 0, dt, value); }

em_tensor *em_arange(double start, double end, double step, em_dtype dt)
{
    if (step == 0 || !isfinite(step) || !isfinite(start) || !isfinite(end))
        return em__fail(EM_ERR_INVALID, "em_arange: step must be non-zero and bounds finite (start %g, end %g, step %g)", start, end, step);
    if ((end - start) / step < 0)
        return em__fail(EM_ERR_INVALID, "em_arange: step %g does not go from %g towards %g", step, start, end);
    int64_t n = (int64_t)ceil((end - start) / step);
    union em_op_params p = {.range = {.start = start, .step = step, .end = end, .n = n}};
    return fill_op(EM_OP_ARANGE, &n, 1, dt, &p);
}

em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt)
{
    if (steps < 0) return em__fail(EM_ERR_INVALID, "em_linspace: steps must be >= 0, got %lld", (long long)steps);
    double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0.0;
    union em_op_params p = {.range = {.start = start, .step = step, .end = end, .n = steps, .linspace = 1}};
    return fill_op(EM_OP_ARANGE, &steps, 1, dt, &p);
}

em_tensor *em_eye(int64_t n, int64_t m, em_dtype dt)
{
    if (m <= 0) m = n;
    if (n < 0) return em__fail(EM_ERR_INVALID, "em_eye: n must be >= 0, got %lld", (long long)n);
    int64_t shape[2] = {n, m};
    return fill_op(EM_OP_EYE, shape, 2, dt, NULL);
}

/* ---- random ---------------------------------------------------------------- */

static uint64_t g_seed = 0x853c49e6748fea9bULL, g_offset;
static pthread_mutex_t g_rng_lock = PTHREAD_MUTEX_INITIALIZER;
/* A thread's own stream (em__rng_thread_begin): replica threads draw from
 * these, so what each replica gets does not depend on thread timing. */
static _Thread_local bool tl_rng_own;
static _Thread_local uint64_t tl_seed, tl_offset, tl_start;

void em__rng_thread_begin(uint64_t seed, uint64_t offset)
{
    tl_rng_own = true;
    tl_seed = seed;
    tl_offset = tl_start = offset;
}

uint64_t em__rng_thread_end(void)
{
    tl_rng_own = false;
    return tl_offset - tl_start;
}

void em_manual_seed(uint64_t seed)
{
    pthread_mutex_lock(&g_rng_lock);
    g_seed = seed;
    g_offset = 0;
    pthread_mutex_unlock(&g_rng_lock);
}

void em_rng_get_state(uint64_t *seed, uint64_t *offset)
{
    pthread_mutex_lock(&g_rng_lock);
    if (seed) *seed = g_seed;
    if (offset) *offset = g_offset;
    pthread_mutex_unlock(&g_rng_lock);
}

void em_rng_set_state(uint64_t seed, uint64_t offset)
{
    pthread_mutex_lock(&g_rng_lock);
    g_seed = seed;
    g_offset = offset;
    pthread_mutex_unlock(&g_rng_lock);
}

void em__rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset)
{
    em__capture_rng(n, 0);
    if (tl_rng_own) {
        *seed = tl_seed;
        *offset = tl_offset;
        tl_offset += n;
    } else {
        pthread_mutex_lock(&g_rng_lock);
        *seed = g_seed;
        *offset = g_offset;
        g_offset += n;
        pthread_mutex_unlock(&g_rng_lock);
    }
}

/* A captured random op's replay (em__capture_patch_last): its n counters. */
static void rng_patch(void *ctx, union em_op_params *p)
{
    uint64_t n;
    memcpy(&n, ctx, sizeof n);
    em__rng_reserve(n, &p->rng.seed, &p->rng.offset);
}

static em_tensor *rand_op(enum em_op_kind kind, const int64_t *shape, int ndim, em_dtype dt, double a, double b, const char *name)
{
    if (kind != EM_OP_RAND_BERNOULLI && !em_dtype_is_float(dt))
        return em__fail(EM_ERR_DTYPE, "%s: dtype must be a float dtype, got %s", name, em_dtype_name(dt));
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em__fail(EM_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", name, ndim, EM_MAX_DIMS);
    if (ndim > 0 && !shape) return em__fail_null("%s: shape is NULL", name);
    int64_t n = em__numel(shape, ndim);
    union em_op_params p;
    memset(&p, 0, sizeof p);
    em__rng_reserve((uint64_t)(n > 0 ? n : 0), &p.rng.seed, &p.rng.offset);
    p.rng.a = a;
    p.rng.b = b;
    em_tensor *t = fill_op(kind, shape, ndim, dt, &p);
    if (t && n > 0 && em__capture_current()) { /* a replay draws the next n counters, as the eager op would */
        const uint64_t un = (uint64_t)(n > 0 ? n : 0);
        em__capture_patch_last(kind, rng_patch, &un, sizeof un);
        em__capture_rng(0, un);
    }
    return t;
}

em_tensor *em_rand_uniform(const int64_t *shape, int ndim, em_dtype dt, double low, double high)
{
    if (!(low <= high)) return em__fail(EM_ERR_INVALID, "em_rand_uniform: low %g must be <= high %g", low, high);
    return rand_op(EM_OP_RAND_UNIFORM, shape, ndim, dt, low, high, "em_rand_uniform");
}

em_tensor *em_rand_normal(const int64_t *shape, int ndim, em_dtype dt, double mean, double std)
{
    if (!(std >= 0)) return em__fail(EM_ERR_INVALID, "em_rand_normal: std must be >= 0, got %g", std);
    return rand_op(EM_OP_RAND_NORMAL, shape, ndim, dt, mean, std, "em_rand_normal");
}

em_tensor *em_rand_bernoulli(const int64_t *shape, int ndim, em_dtype dt, double p)
{
    if (!(p >= 0 && p <= 1)) return em__fail(EM_ERR_INVALID, "em_rand_bernoulli: p must be in [0, 1], got %g", p);
    return rand_op(EM_OP_RAND_BERNOULLI, shape, ndim, dt, p, 0, "em_rand_bernoulli");
}
