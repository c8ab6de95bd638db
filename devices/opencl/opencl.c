/* OpenCL backend: program build per device, the kernel table, shared helpers.
 *
 * Ops WITH an OpenCL kernel (every non-view op of tasks/ops.def):
 *   element-wise unary / tensor-scalar (NEG .. GE_SCALAR), binary (ADD ..
 *   LOGICAL_OR), WHERE, COPY (strided copy + cast), reductions (SUM PROD MAX
 *   MIN ARGMAX ARGMIN ANY ALL LOGSUMEXP VAR), SOFTMAX, LOG_SOFTMAX, MATMUL,
 *   GATHER, SCATTER, SCATTER_ADD, INDEX_SELECT, ONE_HOT, FILL, ARANGE, EYE,
 *   RAND_UNIFORM, RAND_NORMAL, RAND_BERNOULLI, SGD_STEP, ADAM_STEP,
 *   RMSPROP_STEP, ADAGRAD_STEP.
 * Ops WITHOUT an OpenCL kernel (NULL in em__opencl_kernels):
 *   none besides the views (VIEW_RESHAPE, VIEW_PERMUTE, VIEW_EXPAND,
 *   VIEW_SLICE, VIEW_ALIAS, VIEW_CAT), which run no task at all.
 * Cases a device cannot run natively go through em_ocl_host_fallback (the
 * CPU kernel on mapped buffers): f64 data and double-precision computations
 * (arange, random, f64 reductions) on a device without cl_khr_fp64.
 * An op appended to ops.def later simply gets NULL here (runs on the CPU)
 * until a kernel is added to the table below.
 *
 * Program: em_cl_source (all devices/opencl/<name>.cl, embedded by
 * cmake/embed_cl.cmake) behind a generated prefix with the EM_OP_* / EM_DT_*
 * / EM_OPTIM_F_* numbers, built by clBuildProgram once per OpenCL device in
 * em__opencl_init (PoCL caches the binary in POCL_CACHE_DIR). A build
 * failure makes em_init fail with the build log in the message.
 * Environment: EMBER_OPENCL_NO_FP64=1 builds without double support (to test
 * the host fallback on a device that has fp64). */
#include "devices/opencl/opencl.h"
#include "devices/kerror.h"
#include "optim/optim_kargs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char em_cl_source[];

em_kernel_fn em__opencl_kernels[EM_OP_COUNT] = {
#define EW1(E) [EM_OP_##E] = em_ocl_unary,
    EW1(NEG) EW1(ABS) EW1(SIGN) EW1(EXP) EW1(LOG) EW1(LOG1P) EW1(SQRT) EW1(RSQRT) EW1(RECIPROCAL) EW1(SQUARE)
    EW1(SIN) EW1(COS) EW1(TANH) EW1(SIGMOID) EW1(RELU) EW1(GELU) EW1(GELU_TANH) EW1(SILU) EW1(SOFTPLUS) EW1(ERF)
    EW1(FLOOR) EW1(CEIL) EW1(ROUND) EW1(CLAMP) EW1(POW_SCALAR) EW1(LEAKY_RELU) EW1(ELU) EW1(LOGICAL_NOT)
    EW1(ADD_SCALAR) EW1(SUB_SCALAR) EW1(RSUB_SCALAR) EW1(MUL_SCALAR) EW1(DIV_SCALAR) EW1(MAXIMUM_SCALAR)
    EW1(MINIMUM_SCALAR) EW1(REMAINDER_SCALAR) EW1(EQ_SCALAR) EW1(NE_SCALAR) EW1(LT_SCALAR) EW1(LE_SCALAR)
    EW1(GT_SCALAR) EW1(GE_SCALAR)
#undef EW1
#define EW2(E) [EM_OP_##E] = em_ocl_binary,
    EW2(ADD) EW2(SUB) EW2(MUL) EW2(DIV) EW2(POW) EW2(MAXIMUM) EW2(MINIMUM) EW2(REMAINDER) EW2(EQ) EW2(NE) EW2(LT)
    EW2(LE) EW2(GT) EW2(GE) EW2(LOGICAL_AND) EW2(LOGICAL_OR)
#undef EW2
    [EM_OP_WHERE] = em_ocl_where,
    [EM_OP_SUM] = em_ocl_reduce, [EM_OP_PROD] = em_ocl_reduce, [EM_OP_MAX] = em_ocl_reduce,
    [EM_OP_MIN] = em_ocl_reduce, [EM_OP_ARGMAX] = em_ocl_reduce, [EM_OP_ARGMIN] = em_ocl_reduce,
    [EM_OP_ANY] = em_ocl_reduce, [EM_OP_ALL] = em_ocl_reduce, [EM_OP_LOGSUMEXP] = em_ocl_reduce,
    [EM_OP_VAR] = em_ocl_reduce,
    [EM_OP_SOFTMAX] = em_ocl_softmax, [EM_OP_LOG_SOFTMAX] = em_ocl_softmax,
    [EM_OP_MATMUL] = em_ocl_matmul,
    [EM_OP_COPY] = em_ocl_copy,
    [EM_OP_GATHER] = em_ocl_index, [EM_OP_SCATTER] = em_ocl_index, [EM_OP_SCATTER_ADD] = em_ocl_index,
    [EM_OP_INDEX_SELECT] = em_ocl_index, [EM_OP_ONE_HOT] = em_ocl_index,
    [EM_OP_FILL] = em_ocl_fill, [EM_OP_ARANGE] = em_ocl_fill, [EM_OP_EYE] = em_ocl_fill,
    [EM_OP_RAND_UNIFORM] = em_ocl_fill, [EM_OP_RAND_NORMAL] = em_ocl_fill, [EM_OP_RAND_BERNOULLI] = em_ocl_fill,
    [EM_OP_SGD_STEP] = em_ocl_optim, [EM_OP_ADAM_STEP] = em_ocl_optim, [EM_OP_RMSPROP_STEP] = em_ocl_optim,
    [EM_OP_ADAGRAD_STEP] = em_ocl_optim,
};

em_ocl_dev em__ocl_devs[STARPU_MAXOPENCLDEVS];

/* Exported for tests/test_consistency.c (libember hides its internals): the
 * OpenCL kernel table, to tell "ran on OpenCL" from "fell back to the CPU". */
EM_API const em_kernel_fn *em__opencl_kernel_table(void);
const em_kernel_fn *em__opencl_kernel_table(void) { return em__opencl_kernels; }

static const char *const g_kernel_names[EMK_COUNT] = {
#define X(n) "em_" #n,
    EM_OCL_KERNEL_LIST(X)
#undef X
};

/* Kernels that exist only when the program has double support. */
static bool needs_fp64(int id)
{
    const char *n = g_kernel_names[id];
    return strstr(n, "f64") || !strcmp(n, "em_arange") || !strcmp(n, "em_rand");
}

/* ---- small helpers ------------------------------------------------------------ */

void em_ocl_error(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    em__kernel_error(NULL, EM_ERR_DEVICE, "opencl: %s", buf);
}

int64_t em_ocl_numel(const em_tdesc *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

int em_ocl_collapse(int ndim, const int64_t *shape, int nops, const int64_t *const *strides, int64_t *oshape,
                    int64_t ost[][EM_KARGS_MAX_DIMS])
{
    int nd = 0;
    for (int k = 0; k < nops; k++) memset(ost[k], 0, sizeof ost[k]);
    memset(oshape, 0, sizeof(int64_t) * EM_KARGS_MAX_DIMS);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (ost[k][nd - 1] != strides[k][d] * shape[d]) merge = false;
            if (merge) {
                oshape[nd - 1] *= shape[d];
                for (int k = 0; k < nops; k++) ost[k][nd - 1] = strides[k][d];
                continue;
            }
        }
        oshape[nd] = shape[d];
        for (int k = 0; k < nops; k++) ost[k][nd] = strides[k][d];
        nd++;
    }
    if (nd == 0) {
        oshape[0] = 1;
        for (int k = 0; k < nops; k++) ost[k][0] = 0;
        nd = 1;
    }
    return nd;
}

/* ---- per-call context and arguments ------------------------------------------- */

bool em_ocl_enter(em_ocl_ctx *c, const em_kargs *k, const char *what)
{
    int w = starpu_worker_get_id();
    int devid = w >= 0 ? starpu_worker_get_devid(w) : -1;
    if (devid < 0 || devid >= STARPU_MAXOPENCLDEVS || !em__ocl_devs[devid].ready) {
        em_ocl_error("%s (op %s): no OpenCL program for device %d, task skipped", what,
                     (unsigned)k->kind < EM_OP_COUNT ? em__optab[k->kind].name : "?", devid);
        return false;
    }
    c->devid = devid;
    c->d = &em__ocl_devs[devid];
    starpu_opencl_get_queue(devid, &c->q);
    return true;
}

em_ocl_args em_ocl_args_begin(em_ocl_ctx *c, int kernel_id)
{
    em_ocl_args a = {.c = c, .k = c->d->k[kernel_id], .id = kernel_id, .i = 0, .err = CL_SUCCESS};
    pthread_mutex_lock(&c->d->lock);
    if (!a.k) a.err = CL_INVALID_KERNEL;
    return a;
}

void em_ocl_arg(em_ocl_args *a, size_t size, const void *value)
{
    if (a->err == CL_SUCCESS) a->err = clSetKernelArg(a->k, a->i, size, value);
    a->i++;
}

void em_ocl_arg_i32(em_ocl_args *a, int32_t v)
{
    cl_int x = v;
    EM_OCL_ARG(a, x);
}

void em_ocl_arg_i64(em_ocl_args *a, int64_t v)
{
    cl_long x = v;
    EM_OCL_ARG(a, x);
}

void em_ocl_arg_u64(em_ocl_args *a, uint64_t v)
{
    cl_ulong x = v;
    EM_OCL_ARG(a, x);
}

void em_ocl_arg_acc(em_ocl_args *a, double v)
{
    if (a->c->d->fp64) {
        cl_double x = v;
        EM_OCL_ARG(a, x);
    } else {
        cl_float x = (cl_float)v;
        EM_OCL_ARG(a, x);
    }
}

void em_ocl_arg_real(em_ocl_args *a, int dt, double v)
{
    if (dt == EM_F64) {
        cl_double x = v;
        EM_OCL_ARG(a, x);
    } else {
        cl_float x = (cl_float)v;
        EM_OCL_ARG(a, x);
    }
}

void em_ocl_arg_long8(em_ocl_args *a, const int64_t *v, int n)
{
    cl_long8 x;
    memset(&x, 0, sizeof x);
    for (int i = 0; i < n && i < 8; i++) x.s[i] = v[i];
    EM_OCL_ARG(a, x);
}

void em_ocl_arg_buf(em_ocl_args *a, void *iface)
{
    cl_mem m = (cl_mem)STARPU_VECTOR_GET_DEV_HANDLE(iface);
    cl_long off = (cl_long)STARPU_VECTOR_GET_OFFSET(iface);
    EM_OCL_ARG(a, m);
    EM_OCL_ARG(a, off);
}

void em_ocl_arg_local(em_ocl_args *a, size_t bytes) { em_ocl_arg(a, bytes, NULL); }

bool em_ocl_launch(em_ocl_args *a, cl_uint dims, const size_t *g, const size_t *l, const char *what)
{
    size_t gs[3] = {0, 0, 0};
    bool empty = false;
    for (cl_uint i = 0; i < dims; i++) {
        gs[i] = g[i];
        if (l && l[i]) gs[i] = (gs[i] + l[i] - 1) / l[i] * l[i];
        if (gs[i] == 0) empty = true;
    }
    cl_int err = a->err;
    if (err == CL_SUCCESS && !empty) err = clEnqueueNDRangeKernel(a->c->q, a->k, dims, NULL, gs, l, 0, NULL, NULL);
    pthread_mutex_unlock(&a->c->d->lock);
    if (err != CL_SUCCESS) {
        em_ocl_error("%s: kernel %s failed (OpenCL error %d at argument %u)", what, g_kernel_names[a->id], (int)err,
                     a->i);
        return false;
    }
    return true;
}

bool em_ocl_launch_1d(em_ocl_args *a, int64_t n, const char *what)
{
    size_t wg = a->c->d->kwg[a->id] ? a->c->d->kwg[a->id] : 64;
    int64_t groups = n > 0 ? (n + (int64_t)wg - 1) / (int64_t)wg : 0;
    if (groups > 65536) groups = 65536; /* grid-stride loops cover the rest */
    size_t g = (size_t)groups * wg;
    return em_ocl_launch(a, 1, &g, &wg, what);
}

/* ---- host fallback --------------------------------------------------------------- */

void em_ocl_host_fallback(void *buffers[], const em_kargs *k)
{
    enum { NB = EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT };
    if ((unsigned)k->kind >= EM_OP_COUNT || !em__optab[k->kind].cpu) {
        em_ocl_error("host fallback: op %d has no CPU kernel", (int)k->kind);
        return;
    }
    int nb = k->n_in + k->n_out;
    if (nb > NB) nb = NB;
    cl_command_queue q;
    starpu_opencl_get_current_queue(&q);
    struct starpu_vector_interface vi[NB];
    void *ifs[NB], *map[NB];
    cl_mem mem[NB];
    int owner[NB];
    bool ok = true;
    for (int i = 0; i < nb; i++) {
        const struct starpu_vector_interface *v = buffers[i];
        mem[i] = (cl_mem)v->dev_handle;
        owner[i] = -1;
        map[i] = NULL;
        for (int j = 0; j < i; j++)
            if (mem[j] == mem[i] && ((const struct starpu_vector_interface *)buffers[j])->offset == v->offset) owner[i] = j;
        if (owner[i] >= 0) {
            map[i] = map[owner[i]];
        } else if (ok) {
            cl_int err;
            map[i] = clEnqueueMapBuffer(q, mem[i], CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, v->offset,
                                        (size_t)v->nx * v->elemsize, 0, NULL, NULL, &err);
            if (err != CL_SUCCESS || !map[i]) {
                em_ocl_error("host fallback (op %s): clEnqueueMapBuffer failed (%d)", em__optab[k->kind].name, (int)err);
                map[i] = NULL;
                ok = false;
            }
        }
        vi[i] = *v;
        vi[i].ptr = (uintptr_t)map[i];
        vi[i].dev_handle = (uintptr_t)map[i];
        vi[i].offset = 0;
        ifs[i] = &vi[i];
    }
    if (ok) em__optab[k->kind].cpu(ifs, (void *)k);
    for (int i = 0; i < nb; i++)
        if (owner[i] < 0 && map[i]) clEnqueueUnmapMemObject(q, mem[i], map[i], 0, NULL, NULL);
}

/* ---- init / shutdown ----------------------------------------------------------------- */

static char *make_prefix(const em_ocl_dev *d, bool no_fp64)
{
    size_t cap = 16384, len = 0;
    char *p = malloc(cap);
    if (!p) return NULL;
#define APPEND(...)                                                                     \
    do {                                                                                \
        int n_ = snprintf(p + len, cap - len, __VA_ARGS__);                             \
        if (n_ > 0) len += (size_t)n_ < cap - len ? (size_t)n_ : cap - len - 1;         \
    } while (0)
    APPEND("/* generated by devices/opencl/opencl.c */\n");
#define X(E, nm, nin, nout, fl, fn) APPEND("#define EM_OP_%s %d\n", #E, (int)EM_OP_##E);
#include "tasks/ops.def"
#undef X
    APPEND("#define EM_DT_F32 %d\n#define EM_DT_F64 %d\n#define EM_DT_I32 %d\n#define EM_DT_I64 %d\n"
           "#define EM_DT_U8 %d\n#define EM_DT_BOOL %d\n",
           EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL);
    APPEND("#define EM_OPTIM_F_MOMENTUM %d\n#define EM_OPTIM_F_INIT_BUF %d\n#define EM_OPTIM_F_NESTEROV %d\n"
           "#define EM_OPTIM_F_AMSGRAD %d\n#define EM_OPTIM_F_DECOUPLED %d\n#define EM_OPTIM_F_CENTERED %d\n"
           "#define EM_OPTIM_F_MAXIMIZE %d\n",
           EM_OPTIM_F_MOMENTUM, EM_OPTIM_F_INIT_BUF, EM_OPTIM_F_NESTEROV, EM_OPTIM_F_AMSGRAD, EM_OPTIM_F_DECOUPLED,
           EM_OPTIM_F_CENTERED, EM_OPTIM_F_MAXIMIZE);
    APPEND("#define EM_TILE %d\n", d->tile);
    if (no_fp64) APPEND("#define EM_NO_FP64 1\n");
#undef APPEND
    return p;
}

static void dev_release(em_ocl_dev *d)
{
    for (int i = 0; i < EMK_COUNT; i++)
        if (d->k[i]) {
            clReleaseKernel(d->k[i]);
            d->k[i] = NULL;
        }
    if (d->prog) {
        clReleaseProgram(d->prog);
        d->prog = NULL;
    }
    if (d->ready) pthread_mutex_destroy(&d->lock);
    d->ready = false;
}

static em_status dev_build(int devid)
{
    em_ocl_dev *d = &em__ocl_devs[devid];
    if (d->ready) return EM_OK;
    memset(d, 0, sizeof *d);
    starpu_opencl_get_context(devid, &d->ctx);
    starpu_opencl_get_device(devid, &d->dev);
    char devname[256] = "?", ext[8192] = "";
    clGetDeviceInfo(d->dev, CL_DEVICE_NAME, sizeof devname, devname, NULL);
    clGetDeviceInfo(d->dev, CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
    clGetDeviceInfo(d->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg, &d->max_wg, NULL);
    cl_device_fp_config sp = 0;
    clGetDeviceInfo(d->dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof sp, &sp, NULL);
    const char *nf = getenv("EMBER_OPENCL_NO_FP64");
    bool no_fp64 = nf && *nf && strcmp(nf, "0") != 0;
    bool has_fp64 = strstr(ext, "cl_khr_fp64") != NULL;
    d->fp64 = has_fp64 && !no_fp64;
    d->tile = d->max_wg >= 256 ? 16 : 8;

    char *prefix = make_prefix(d, !d->fp64);
    if (!prefix) return em__set_error(EM_ERR_NOMEM, "opencl: out of memory building the program");
    const char *srcs[2] = {prefix, em_cl_source};
    cl_int err;
    d->prog = clCreateProgramWithSource(d->ctx, 2, srcs, NULL, &err);
    free(prefix);
    if (err != CL_SUCCESS)
        return em__set_error(EM_ERR_DEVICE, "opencl: clCreateProgramWithSource failed on device %d (%s): %d", devid,
                             devname, (int)err);
    char opts[256];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2%s",
             (sp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    err = clBuildProgram(d->prog, 1, &d->dev, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t sz = 0;
        clGetProgramBuildInfo(d->prog, d->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &sz);
        char *log = malloc(sz + 1);
        if (log) {
            log[0] = 0;
            clGetProgramBuildInfo(d->prog, d->dev, CL_PROGRAM_BUILD_LOG, sz, log, NULL);
            log[sz] = 0;
            if (sz > 3000) log[3000] = 0; /* keep the message bounded */
        }
        em_status st = em__set_error(EM_ERR_DEVICE,
                                     "opencl: building Ember's kernels failed on device %d (%s), error %d "
                                     "(set EMBER_NOPENCL=0 to run without OpenCL): %s",
                                     devid, devname, (int)err, log ? log : "");
        free(log);
        clReleaseProgram(d->prog);
        d->prog = NULL;
        return st;
    }
    for (int i = 0; i < EMK_COUNT; i++) {
        d->k[i] = clCreateKernel(d->prog, g_kernel_names[i], &err);
        if (err != CL_SUCCESS) d->k[i] = NULL;
        if (!d->k[i] && (d->fp64 || !needs_fp64(i))) {
            em_status st = em__set_error(EM_ERR_DEVICE, "opencl: kernel %s missing on device %d (%s): %d",
                                         g_kernel_names[i], devid, devname, (int)err);
            dev_release(d);
            return st;
        }
        size_t kw = 0;
        if (d->k[i]) clGetKernelWorkGroupInfo(d->k[i], d->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof kw, &kw, NULL);
        if (kw == 0 || kw > d->max_wg) kw = d->max_wg ? d->max_wg : 1;
        size_t p = 1;
        while (p * 2 <= kw && p * 2 <= 256) p *= 2;
        d->kwg[i] = p;
    }
    pthread_mutex_init(&d->lock, NULL);
    d->ready = true;
    em_log_msg(EM_LOG_INFO, "opencl: kernels built for device %d (%s)%s", devid, devname,
               d->fp64 ? "" : ", without fp64 (f64 ops use the host fallback)");
    return EM_OK;
}

em_status em__opencl_init(void)
{
    unsigned nw = starpu_worker_get_count();
    for (unsigned w = 0; w < nw; w++) {
        if (starpu_worker_get_type((int)w) != STARPU_OPENCL_WORKER) continue;
        int devid = starpu_worker_get_devid((int)w);
        if (devid < 0 || devid >= STARPU_MAXOPENCLDEVS) continue;
        em_status st = dev_build(devid);
        if (st != EM_OK) {
            em__opencl_shutdown();
            return st;
        }
    }
    return EM_OK;
}

void em__opencl_shutdown(void)
{
    em_ocl_matmul_shutdown();
    for (int i = 0; i < STARPU_MAXOPENCLDEVS; i++) dev_release(&em__ocl_devs[i]);
}
