/* OpenCL host function of FUSED: runs an em_fused_prog (devices/kargs.h)
 * with the interpreter kernels em_fused_f32 / em_fused_f64
 * (devices/opencl/fused.cl, argument layout there).
 *
 * The whole program is checked first (em_fused_check, devices/fused_check.h)
 * and a bad one reported through em_ocl_error (the op's sticky error, as
 * em_ocl_unary's bad kind), enqueueing nothing. The shape is collapsed over
 * the leaves' strides (devices/collapse.h) and the program compacted
 * (shape, strides, instructions, scalars rounded to T) into a small
 * read-only buffer created for the call (CL_DEVICE_MAX_PARAMETER_SIZE is
 * only 1024 bytes on PoCL, so it cannot be a by-value argument). That
 * buffer is released by the completion callback of the kernel's event, so
 * it lives exactly until the kernel is done; if the callback cannot be set
 * it is released at once, which OpenCL defines as deferred until the
 * commands using it have finished.
 *
 * f64 on a device without double support (or EMBER_OPENCL_NO_FP64=1): the
 * CPU kernel (em_cpu_fused) on mapped buffers (em_ocl_host_fallback_n, with
 * the task's n_leaf + n_out buffers). */
#include "devices/opencl/opencl.h"
#include "devices/collapse.h"
#include "devices/fused_check.h"

#include <stddef.h>
#include <string.h>

/* The compact program of fused.cl (em_fused_head, em_fused_prog_<S>). */
typedef struct em_ocl_fused_head {
    cl_long shape[EM_KARGS_MAX_DIMS];
    cl_long st[EM_FUSED_MAX_LEAVES][EM_KARGS_MAX_DIMS];
    cl_int ins[EM_FUSED_MAX_INSTR][4]; /* kind, register a, register b, arity */
    cl_int out_reg[EM_FUSED_MAX_OUT];
} em_ocl_fused_head;

typedef struct em_ocl_fused_prog_f32 {
    em_ocl_fused_head h;
    cl_float s[EM_FUSED_MAX_INSTR][2];
} em_ocl_fused_prog_f32;

typedef struct em_ocl_fused_prog_f64 {
    em_ocl_fused_head h;
    cl_double s[EM_FUSED_MAX_INSTR][2];
} em_ocl_fused_prog_f64;

/* The layout OpenCL C gives the same declarations (natural alignment, no
 * padding: every member's offset is a multiple of its size). */
_Static_assert(offsetof(em_ocl_fused_head, st) == 8 * EM_KARGS_MAX_DIMS &&
                   offsetof(em_ocl_fused_head, ins) == 8 * EM_KARGS_MAX_DIMS * (1 + EM_FUSED_MAX_LEAVES) &&
                   offsetof(em_ocl_fused_head, out_reg) ==
                       8 * EM_KARGS_MAX_DIMS * (1 + EM_FUSED_MAX_LEAVES) + 16 * EM_FUSED_MAX_INSTR &&
                   sizeof(em_ocl_fused_head) % 8 == 0,
               "em_ocl_fused_head: the layout of fused.cl's em_fused_head");
_Static_assert(offsetof(em_ocl_fused_prog_f32, s) == sizeof(em_ocl_fused_head) &&
                   offsetof(em_ocl_fused_prog_f64, s) == sizeof(em_ocl_fused_head),
               "em_ocl_fused_prog_<S>: the scalars right after the head");

static void CL_CALLBACK release_prog(cl_event ev, cl_int status, void *mem)
{
    (void)ev;
    (void)status;
    clReleaseMemObject((cl_mem)mem);
}

/* Fills the compact head from @p p: the collapsed shape and strides. */
static void fill_head(em_ocl_fused_head *h, const em_fused_prog *p, int *nd)
{
    const int64_t *st[EM_FUSED_MAX_LEAVES] = {0};
    for (int l = 0; l < p->n_leaf; l++) st[l] = p->leaf[l].strides;
    int64_t shape[EM_KARGS_MAX_DIMS], cst[EM_FUSED_MAX_LEAVES][EM_KARGS_MAX_DIMS];
    memset(h, 0, sizeof *h);
    memset(cst, 0, sizeof cst);
    *nd = em_ocl_collapse(p->ndim, p->shape, p->n_leaf, st, shape, cst);
    for (int d = 0; d < EM_KARGS_MAX_DIMS; d++) h->shape[d] = shape[d];
    for (int l = 0; l < p->n_leaf; l++)
        for (int d = 0; d < EM_KARGS_MAX_DIMS; d++) h->st[l][d] = cst[l][d];
    for (int j = 0; j < p->n_instr; j++) {
        h->ins[j][0] = p->ins[j].kind;
        h->ins[j][1] = p->ins[j].a;
        h->ins[j][2] = em_fused_arity(p->ins[j].kind) == 2 ? p->ins[j].b : 0;
        h->ins[j][3] = em_fused_arity(p->ins[j].kind);
    }
    for (int o = 0; o < p->n_out; o++) h->out_reg[o] = p->out_reg[o];
}

void em_ocl_fused(void *buffers[], void *cl_arg)
{
    const em_fused_args *fa = cl_arg;
    const em_kargs *k = &fa->k;
    const em_fused_prog *p = &fa->prog;
    int bad = 0;
    const char *fault = em_fused_check(k, p, &bad);
    if (fault) {
        em_ocl_error("%s (%d)", fault, bad);
        return;
    }
    const bool f64 = p->dtype == EM_F64;
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "fused")) return;
    const int kid = f64 ? EMK_fused_f64 : EMK_fused_f32;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback_n(buffers, p->n_leaf + p->n_out, k);
        return;
    }

    em_ocl_fused_prog_f32 pf;
    em_ocl_fused_prog_f64 pd;
    em_ocl_fused_head *h = f64 ? &pd.h : &pf.h;
    int nd = 1;
    fill_head(h, p, &nd);
    memset(f64 ? (void *)pd.s : (void *)pf.s, 0, f64 ? sizeof pd.s : sizeof pf.s);
    for (int j = 0; j < p->n_instr; j++) {
        if (f64) {
            pd.s[j][0] = p->ins[j].sa;
            pd.s[j][1] = p->ins[j].sb;
        } else {
            pf.s[j][0] = (cl_float)p->ins[j].sa;
            pf.s[j][1] = (cl_float)p->ins[j].sb;
        }
    }
    cl_int err;
    cl_mem prog = clCreateBuffer(c.d->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, f64 ? sizeof pd : sizeof pf,
                                 f64 ? (void *)&pd : (void *)&pf, &err);
    if (err != CL_SUCCESS || !prog) {
        em_ocl_error("fused: creating the program buffer failed (OpenCL error %d)", (int)err);
        return;
    }

    const size_t es = f64 ? sizeof(cl_double) : sizeof(cl_float);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    for (int l = 0; l < EM_FUSED_MAX_LEAVES; l++) {
        cl_mem m = NULL;
        cl_long off = 0;
        if (l < p->n_leaf) {
            m = (cl_mem)STARPU_VECTOR_GET_DEV_HANDLE(buffers[l]);
            off = (cl_long)STARPU_VECTOR_GET_OFFSET(buffers[l]) + (cl_long)(p->leaf[l].offset * (int64_t)es);
        }
        EM_OCL_ARG(&a, m);
        EM_OCL_ARG(&a, off);
    }
    for (int o = 0; o < EM_FUSED_MAX_OUT; o++) {
        cl_mem m = NULL;
        cl_long off = 0;
        if (o < p->n_out) {
            m = (cl_mem)STARPU_VECTOR_GET_DEV_HANDLE(buffers[p->n_leaf + o]);
            off = (cl_long)STARPU_VECTOR_GET_OFFSET(buffers[p->n_leaf + o]);
        }
        EM_OCL_ARG(&a, m);
        EM_OCL_ARG(&a, off);
    }
    EM_OCL_ARG(&a, prog);
    em_ocl_arg_i32(&a, nd);
    em_ocl_arg_i32(&a, p->n_leaf);
    em_ocl_arg_i32(&a, p->n_instr);
    em_ocl_arg_i32(&a, p->n_out);
    em_ocl_arg_i64(&a, p->numel);
    cl_event ev = NULL;
    em_ocl_launch_1d_ev(&a, p->numel, &ev, "fused");
    /* the kernel's arguments are set at enqueue: the buffer may go once it is done */
    if (!ev || clSetEventCallback(ev, CL_COMPLETE, release_prog, prog) != CL_SUCCESS) clReleaseMemObject(prog);
    if (ev) clReleaseEvent(ev);
}
