/* CUDA kernel of STEP: a captured step's recorded tasks on one CUDA worker
 * (the contract: em_step_plan, devices/kargs.h; built by tasks/capture.c).
 *
 * StarPU has no CUDA-graph support, so the graph lives here, inside the
 * codelet (DESIGN.md §6). The plan is cut into segments: a maximal run of at
 * least two recorded tasks whose family is safe to capture (below) and whose
 * parameters do not change per replay is one CUDA graph, captured from the
 * tasks' own kernel functions on the worker's stream at the segment's first
 * replay on this worker and launched with cudaGraphLaunch from then on; the
 * other tasks are launched as usual. A graph is captured again when a buffer
 * of the STEP task has moved (StarPU may reallocate device copies), and a
 * segment whose capture fails (an operation the stream cannot capture, a
 * kernel error during the capture) runs as plain launches from then on, on
 * this worker, with a debug message: the capture is a trial whose kernel
 * errors are counted, not reported, and the segment then runs for real.
 *
 * EMBER_STEP_PROFILE=1 (a diagnostic, read at a plan's first replay on a
 * worker): no graphs; every recorded task is bracketed by CUDA events and the
 * task waits for its stream at the end (against the rule of emcuda.h, for
 * measuring only); em_step_free prints each recorded task's mean GPU time
 * per replay on stderr. */
#include "devices/cuda/emcuda.h"

#include <stdlib.h>
#include <string.h>

/* Families whose CUDA kernels only queue work on the stream (no waits, no
 * host-side reads of results): capturable. A family missing here is a build
 * error. conv and pool: the cuDNN path waits for the stream once per shape
 * (conv.cu); collectives: NCCL groups are not captured here. */
#define EM_CUDA_GRAPH_unary true
#define EM_CUDA_GRAPH_binary true
#define EM_CUDA_GRAPH_where true
#define EM_CUDA_GRAPH_reduce true
#define EM_CUDA_GRAPH_softmax true
#define EM_CUDA_GRAPH_matmul true
#define EM_CUDA_GRAPH_copy true
#define EM_CUDA_GRAPH_index true
#define EM_CUDA_GRAPH_fill true
#define EM_CUDA_GRAPH_optim true
#define EM_CUDA_GRAPH_conv false
#define EM_CUDA_GRAPH_pool false
#define EM_CUDA_GRAPH_norm true
#define EM_CUDA_GRAPH_attention true
#define EM_CUDA_GRAPH_fused true
#define EM_CUDA_GRAPH_step false
#define EM_CUDA_GRAPH_collective false
#define EM_CUDA_GRAPH_NONE false

static const bool g_graph_safe[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = EM_CUDA_GRAPH_##fam,
#include "tasks/ops.def"
};

namespace {

struct Segment {
    int begin, end;        /* ops [begin, end) */
    bool graph;            /* captured as a graph (else plain launches) */
    cudaGraphExec_t exec;  /* NULL until captured */
};

struct StepState {
    int nseg;
    Segment *seg;
    void **ptr; /* the STEP task's buffer pointers when the graphs were captured */
    /* EMBER_STEP_PROFILE: per recorded task, GPU milliseconds summed over the replays */
    bool profile;
    double *ms;
    int64_t replays;
    cudaEvent_t *ev; /* n_ops + 1 events */
};

StepState *state_new(const em_step_plan *p)
{
    StepState *s = (StepState *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->seg = (Segment *)calloc((size_t)p->n_ops, sizeof *s->seg);
    s->ptr = (void **)calloc((size_t)(p->n_bufs > 0 ? p->n_bufs : 1), sizeof *s->ptr);
    if (!s->seg || !s->ptr) {
        free(s->seg);
        free(s->ptr);
        free(s);
        return NULL;
    }
    const char *pv = getenv("EMBER_STEP_PROFILE");
    s->profile = pv && strcmp(pv, "0") && *pv;
    if (s->profile) {
        s->ms = (double *)calloc((size_t)p->n_ops, sizeof *s->ms);
        s->ev = (cudaEvent_t *)calloc((size_t)p->n_ops + 1, sizeof *s->ev);
        for (int i = 0; s->ev && i <= p->n_ops; i++) cudaEventCreate(&s->ev[i]);
        if (!s->ms || !s->ev) s->profile = false;
    }
    const bool off = s->profile || (getenv("EMBER_CUDA_GRAPHS") && !strcmp(getenv("EMBER_CUDA_GRAPHS"), "0"));
    for (int i = 0; i < p->n_ops;) {
        const em_step_op *o = &p->ops[i];
        const bool ok = !off && g_graph_safe[o->kind] && o->patch < 0;
        int j = i + 1;
        if (ok)
            while (j < p->n_ops && g_graph_safe[p->ops[j].kind] && p->ops[j].patch < 0) j++;
        Segment &g = s->seg[s->nseg++];
        g.begin = i;
        g.end = j;
        g.graph = ok && j - i >= 2;
        g.exec = NULL;
        i = j;
    }
    return s;
}

void drop_graphs(StepState *s)
{
    for (int k = 0; k < s->nseg; k++)
        if (s->seg[k].exec) {
            cudaGraphExecDestroy(s->seg[k].exec);
            s->seg[k].exec = NULL;
        }
}

void run_plain(const em_step_args *a, const Segment &g, void *buffers[])
{
    for (int i = g.begin; i < g.end; i++) {
        const em_step_op *o = &a->plan->ops[i];
        em__step_run_op(a, o, buffers, em__cuda_kernels[o->kind]);
    }
}

/* Captures segment g into g.exec; false (and g.graph = false) when it cannot be. */
bool capture(const em_step_args *a, Segment &g, void *buffers[])
{
    cudaStream_t s = emc::stream();
    cudaGraph_t graph = NULL;
    em__kernel_trial_begin();
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        run_plain(a, g, buffers);
        e = cudaStreamEndCapture(s, &graph);
    }
    const int errs = em__kernel_trial_end();
    if (e == cudaSuccess && errs == 0) e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e == cudaSuccess && errs == 0) return true;
    cudaGetLastError(); /* clear it: the segment now runs plainly */
    g.exec = NULL;
    g.graph = false;
    em_log_msg(EM_LOG_DEBUG, "step: ops %d..%d cannot be captured as a CUDA graph (%s, %d kernel errors): plain launches",
               g.begin, g.end - 1, cudaGetErrorString(e), errs);
    return false;
}

} // namespace

void em_cuda_step(void *buffers[], void *cl_arg)
{
    const em_step_args *a = (const em_step_args *)cl_arg;
    const em_step_plan *p = a->plan;
    for (int i = 0; i < p->n_ops; i++)
        if ((unsigned)p->ops[i].kind >= EM_OP_COUNT || !em__cuda_kernels[p->ops[i].kind]) {
            em__kernel_error(NULL, EM_ERR_RUNTIME, "internal error: step op %d has no CUDA kernel (kind %d)", i,
                             p->ops[i].kind);
            return;
        }
    const int w = starpu_worker_get_id();
    StepState *st = NULL;
    if (w >= 0 && w < EM_STEP_MAX_WORKERS) {
        em_step_plan *mp = (em_step_plan *)p; /* dev[] is the backend's, written only by worker w */
        if (!mp->dev[w]) mp->dev[w] = state_new(p);
        st = (StepState *)mp->dev[w];
    }
    if (!st) { /* no state: plain launches */
        Segment all = {0, p->n_ops, false, NULL};
        run_plain(a, all, buffers);
        return;
    }
    bool moved = false;
    for (int b = 0; b < p->n_bufs; b++) {
        void *ptr = (void *)STARPU_VECTOR_GET_PTR(buffers[b]);
        if (ptr != st->ptr[b]) moved = true;
        st->ptr[b] = ptr;
    }
    if (moved) drop_graphs(st);
    cudaStream_t s = emc::stream();
    if (st->profile) { /* a diagnostic: each task timed with events, then a wait */
        for (int i = 0; i < p->n_ops; i++) {
            const em_step_op *o = &p->ops[i];
            cudaEventRecord(st->ev[i], s);
            em__step_run_op(a, o, buffers, em__cuda_kernels[o->kind]);
        }
        cudaEventRecord(st->ev[p->n_ops], s);
        if (cudaEventSynchronize(st->ev[p->n_ops]) == cudaSuccess) {
            for (int i = 0; i < p->n_ops; i++) {
                float ms = 0;
                if (cudaEventElapsedTime(&ms, st->ev[i], st->ev[i + 1]) == cudaSuccess) st->ms[i] += ms;
            }
            st->replays++;
        }
        return;
    }
    for (int k = 0; k < st->nseg; k++) {
        Segment &g = st->seg[k];
        if (g.graph && (g.exec || capture(a, g, buffers))) {
            cudaError_t e = cudaGraphLaunch(g.exec, s);
            if (e != cudaSuccess) em__kernel_error(NULL, EM_ERR_DEVICE, "step: cudaGraphLaunch failed: %s", cudaGetErrorString(e));
        } else {
            run_plain(a, g, buffers);
        }
    }
}

/* Frees the graphs and states of plan @p p (after every replay ran:
 * tasks/capture.c em_step_free waits for them first). */
extern "C" void em__cuda_step_release(em_step_plan *p)
{
    for (int w = 0; w < EM_STEP_MAX_WORKERS; w++) {
        StepState *st = (StepState *)p->dev[w];
        if (!st) continue;
        if (st->profile && st->replays > 0) {
            double total = 0;
            for (int i = 0; i < p->n_ops; i++) total += st->ms[i];
            fprintf(stderr, "step profile (worker %d, %lld replays, GPU time per replay; EMBER_STEP_PROFILE):\n", w,
                    (long long)st->replays);
            for (int i = 0; i < p->n_ops; i++)
                fprintf(stderr, "  %3d %-20s %8.2f us\n", i, em__kernel_info[p->ops[i].kind].name,
                        st->ms[i] * 1e3 / (double)st->replays);
            fprintf(stderr, "  total                    %8.2f us\n", total * 1e3 / (double)st->replays);
        }
        if (st->ev)
            for (int i = 0; i <= p->n_ops; i++) cudaEventDestroy(st->ev[i]);
        free(st->ev);
        free(st->ms);
        drop_graphs(st);
        free(st->seg);
        free(st->ptr);
        free(st);
        p->dev[w] = NULL;
    }
}
