/* OpenCL backend: program build per device, the kernel table, shared helpers.
 *
 * Kernel table: em__opencl_kernels[op] = em_ocl_<family> for every op of
 * tasks/ops.def (its family column), so a family without an OpenCL kernel
 * function is a build error; only the views (VIEW_*), which run no task,
 * have none. Cases a device cannot run natively go through
 * em_ocl_host_fallback (the CPU kernel on mapped buffers): f64 data and
 * double-precision computations (arange, random, f64 reductions) on a
 * device without cl_khr_fp64.
 *
 * Program: a generated prefix with the EM_OP_* / EM_DT_* / EM_OPTIM_F_*
 * numbers, em_cl_source (devices/opencl/common.cl, devices/ew_math.h,
 * devices/half.h, devices/opencl/dtype.cl and the other
 * devices/opencl/<name>.cl, embedded by cmake/embed_cl.cmake), and
 * the element-wise functions generated from the expressions of
 * tasks/ops.def (em_ocl_ew_source, devices/opencl/elementwise.c), built by clBuildProgram once per OpenCL device in
 * em__opencl_init (PoCL caches the binary in POCL_CACHE_DIR). A build
 * failure makes em_init fail with the build log in the message.
 * Environment: EMBER_OPENCL_NO_FP64=1 builds without double support (to test
 * the host fallback on a device that has fp64).
 *
 * f16 / bf16: the unary, binary, where, copy and fill families store them
 * as 16 bits and compute in float (em__opencl_half below); `ember devices`
 * says so per device, with whether it has cl_khr_fp16 (not needed). */
#include "devices/opencl/opencl.h"
#include "devices/collapse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char em_cl_source[];

/* [op] -> em_ocl_<family> (tasks/ops.def): a family without an OpenCL
 * kernel function is a build error. */
#define em_ocl_NONE NULL
#define em_ocl_collective NULL /* collectives run on the CPU or CUDA (dist/) */
em_kernel_fn em__opencl_kernels[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = em_ocl_##fam,
#include "tasks/ops.def"
};
bool em__opencl_compiled(void) { return true; }

/* The families whose OpenCL kernels load and store f16 / bf16 themselves
 * (devices/devices.h): 16-bit storage converted in the kernel by the
 * converters of devices/half.h, float compute (no cl_khr_fp16 needed). The
 * door widens the other families' 16-bit ops (f32 copies in and out). */
#define EM_OCL_HALF_unary true
#define EM_OCL_HALF_binary true
#define EM_OCL_HALF_where true
#define EM_OCL_HALF_copy true
#define EM_OCL_HALF_fill true
#define EM_OCL_HALF_reduce false
#define EM_OCL_HALF_softmax false
#define EM_OCL_HALF_matmul false
#define EM_OCL_HALF_index false
#define EM_OCL_HALF_optim false
#define EM_OCL_HALF_conv false
#define EM_OCL_HALF_pool false
#define EM_OCL_HALF_norm false
#define EM_OCL_HALF_attention false
#define EM_OCL_HALF_step false /* its recorded tasks were widened when recorded */
#define EM_OCL_HALF_fused false /* FUSED: f32 / f64 programs only (fusion/ fuses no 16-bit op) */
#define EM_OCL_HALF_collective false
#define EM_OCL_HALF_NONE false
const bool em__opencl_half[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = EM_OCL_HALF_##fam,
#include "tasks/ops.def"
};

em_ocl_dev em__ocl_devs[STARPU_MAXOPENCLDEVS];


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
    char f[256];
    snprintf(f, sizeof f, "opencl: %s", fmt);
    va_list ap;
    va_start(ap, fmt);
    em__kernel_verror(NULL, EM_ERR_DEVICE, f, ap);
    va_end(ap);
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
    return em_collapse_dims(ndim, shape, nops, strides, oshape, ost);
}

/* ---- per-call context and arguments ------------------------------------------- */

bool em_ocl_enter(em_ocl_ctx *c, const em_kargs *k, const char *what)
{
    int w = starpu_worker_get_id();
    int devid = w >= 0 ? starpu_worker_get_devid(w) : -1;
    if (devid < 0 || devid >= STARPU_MAXOPENCLDEVS || !em__ocl_devs[devid].ready) {
        em_ocl_error("%s (op %s): no OpenCL program for device %d, task skipped", what,
                     (unsigned)k->kind < EM_OP_COUNT ? em__kernel_info[k->kind].name : "?", devid);
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

/* em_ocl_launch, with the kernel's event in *ev when ev is given. */
static bool launch_ev(em_ocl_args *a, cl_uint dims, const size_t *g, const size_t *l, cl_event *ev, const char *what)
{
    size_t gs[3] = {0, 0, 0};
    bool empty = false;
    if (ev) *ev = NULL;
    for (cl_uint i = 0; i < dims; i++) {
        gs[i] = g[i];
        if (l && l[i]) gs[i] = (gs[i] + l[i] - 1) / l[i] * l[i];
        if (gs[i] == 0) empty = true;
    }
    cl_int err = a->err;
    if (err == CL_SUCCESS && !empty) err = clEnqueueNDRangeKernel(a->c->q, a->k, dims, NULL, gs, l, 0, NULL, ev);
    pthread_mutex_unlock(&a->c->d->lock);
    if (err != CL_SUCCESS) {
        em_ocl_error("%s: kernel %s failed (OpenCL error %d at argument %u)", what, g_kernel_names[a->id], (int)err,
                     a->i);
        return false;
    }
    return true;
}

bool em_ocl_launch(em_ocl_args *a, cl_uint dims, const size_t *g, const size_t *l, const char *what)
{
    return launch_ev(a, dims, g, l, NULL, what);
}

static bool launch_1d(em_ocl_args *a, int64_t n, cl_event *ev, const char *what)
{
    size_t wg = a->c->d->kwg[a->id] ? a->c->d->kwg[a->id] : 64;
    int64_t groups = n > 0 ? (n + (int64_t)wg - 1) / (int64_t)wg : 0;
    if (groups > 65536) groups = 65536; /* grid-stride loops cover the rest */
    size_t g = (size_t)groups * wg;
    return launch_ev(a, 1, &g, &wg, ev, what);
}

bool em_ocl_launch_1d(em_ocl_args *a, int64_t n, const char *what) { return launch_1d(a, n, NULL, what); }

bool em_ocl_launch_1d_ev(em_ocl_args *a, int64_t n, cl_event *ev, const char *what) { return launch_1d(a, n, ev, what); }

/* ---- host fallback --------------------------------------------------------------- */

void em_ocl_host_fallback(void *buffers[], const em_kargs *k)
{
    int nb = k->n_in + k->n_out;
    if (nb > EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT) nb = EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT;
    em_ocl_host_fallback_n(buffers, nb, k);
}

void em_ocl_host_fallback_n(void *buffers[], int nb, const em_kargs *k)
{
    enum { NB = EM_OCL_FALLBACK_MAX_BUFS > EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT ? EM_OCL_FALLBACK_MAX_BUFS
                                                                                : EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT };
    if ((unsigned)k->kind >= EM_OP_COUNT || !em__kernel_info[k->kind].cpu) {
        em_ocl_error("host fallback: op %d has no CPU kernel", (int)k->kind);
        return;
    }
    if (nb < 0 || nb > NB) {
        em_ocl_error("host fallback (op %s): %d buffers, at most %d", em__kernel_info[k->kind].name, nb, (int)NB);
        return;
    }
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
                em_ocl_error("host fallback (op %s): clEnqueueMapBuffer failed (%d)", em__kernel_info[k->kind].name, (int)err);
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
    if (ok) em__kernel_info[k->kind].cpu(ifs, (void *)k);
    for (int i = 0; i < nb; i++)
        if (owner[i] < 0 && map[i]) clEnqueueUnmapMemObject(q, mem[i], map[i], 0, NULL, NULL);
}

/* ---- init / shutdown ----------------------------------------------------------------- */

static char *make_prefix(const em_ocl_dev *d, bool no_fp64)
{
    size_t cap = 32768, len = 0;
    char *p = malloc(cap);
    if (!p) return NULL;
#define APPEND(...)                                                                     \
    do {                                                                                \
        int n_ = snprintf(p + len, cap - len, __VA_ARGS__);                             \
        if (n_ > 0) len += (size_t)n_ < cap - len ? (size_t)n_ : cap - len - 1;         \
    } while (0)
    APPEND("/* generated by devices/opencl/opencl.c */\n");
#define OP(E, nm, nin, nout, fl, fam, bw) APPEND("#define EM_OP_%s %d\n", #E, (int)EM_OP_##E);
#include "tasks/ops.def"
    APPEND("#define EM_DT_F32 %d\n#define EM_DT_F64 %d\n#define EM_DT_I32 %d\n#define EM_DT_I64 %d\n"
           "#define EM_DT_U8 %d\n#define EM_DT_BOOL %d\n#define EM_DT_F16 %d\n#define EM_DT_BF16 %d\n",
           EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL, EM_F16, EM_BF16);
    APPEND("#define EM_OPTIM_F_MOMENTUM %d\n#define EM_OPTIM_F_INIT_BUF %d\n#define EM_OPTIM_F_NESTEROV %d\n"
           "#define EM_OPTIM_F_AMSGRAD %d\n#define EM_OPTIM_F_DECOUPLED %d\n#define EM_OPTIM_F_CENTERED %d\n"
           "#define EM_OPTIM_F_MAXIMIZE %d\n",
           EM_OPTIM_F_MOMENTUM, EM_OPTIM_F_INIT_BUF, EM_OPTIM_F_NESTEROV, EM_OPTIM_F_AMSGRAD, EM_OPTIM_F_DECOUPLED,
           EM_OPTIM_F_CENTERED, EM_OPTIM_F_MAXIMIZE);
    APPEND("#define EM_TILE %d\n", d->tile);
    APPEND("#define EM_FUSED_MAX_LEAVES %d\n#define EM_FUSED_MAX_OUT %d\n#define EM_FUSED_MAX_INSTR %d\n"
           "#define EM_FUSED_MAX_REGS %d\n",
           EM_FUSED_MAX_LEAVES, EM_FUSED_MAX_OUT, EM_FUSED_MAX_INSTR, EM_FUSED_MAX_REGS);
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
    d->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
    d->tile = d->max_wg >= 256 ? 16 : 8;

    char *prefix = make_prefix(d, !d->fp64);
    if (!prefix) return em_set_error(EM_ERR_NOMEM, "opencl: out of memory building the program");
    char gerr[256] = "out of memory";
    char *ew = em_ocl_ew_source(d->fp64, gerr, sizeof gerr); /* element-wise functions from tasks/ops.def */
    if (!ew) {
        free(prefix);
        return em_set_error(EM_ERR_RUNTIME, "opencl: generating the element-wise kernels failed: %s", gerr);
    }
    const char *srcs[3] = {prefix, em_cl_source, ew};
    cl_int err;
    d->prog = clCreateProgramWithSource(d->ctx, 3, srcs, NULL, &err);
    free(prefix);
    free(ew);
    if (err != CL_SUCCESS)
        return em_set_error(EM_ERR_DEVICE, "opencl: clCreateProgramWithSource failed on device %d (%s): %d", devid,
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
        em_status st = em_set_error(EM_ERR_DEVICE,
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
            em_status st = em_set_error(EM_ERR_DEVICE, "opencl: kernel %s missing on device %d (%s): %d",
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

/* Numbered as Ember numbers OpenCL devices (opencl:N, runtime/runtime.c's
 * find_worker): in the order the workers drive them. */
void em__opencl_describe(FILE *f)
{
    int seen[STARPU_MAXOPENCLDEVS], nseen = 0;
    unsigned nw = starpu_worker_get_count();
    for (unsigned w = 0; w < nw; w++) {
        if (starpu_worker_get_type((int)w) != STARPU_OPENCL_WORKER) continue;
        int devid = starpu_worker_get_devid((int)w), k = 0;
        while (k < nseen && seen[k] != devid) k++;
        if (k < nseen || nseen == STARPU_MAXOPENCLDEVS) continue;
        seen[nseen++] = devid;
        if (devid < 0 || devid >= STARPU_MAXOPENCLDEVS || !em__ocl_devs[devid].ready) continue;
        fprintf(f, "  opencl:%d  f16/bf16: converted in kernel (cl_khr_fp16: %s)\n", k,
                em__ocl_devs[devid].fp16 ? "yes" : "no");
    }
}

void em__opencl_shutdown(void)
{
    em_ocl_matmul_shutdown();
    for (int i = 0; i < STARPU_MAXOPENCLDEVS; i++) dev_release(&em__ocl_devs[i]);
}
