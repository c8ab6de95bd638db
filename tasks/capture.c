/* Step capture (DESIGN.md §6, issue #17): record the tasks of one step,
 * replay them as one STEP task.
 *
 * Between em_capture_begin and em_capture_end the door (tasks/funnel.c
 * task_submit) hands every task the calling thread submits — and the fused
 * chains its ops formed, whoever flushes them (em_op.capture) — to
 * em__capture_record before submitting it as usual: the step runs once,
 * eagerly, while it is recorded. The recording keeps each task's kind, its
 * kernel arguments (built once: no per-op allocation or packing later) and
 * its buffers, and holds every tensor whose storage a task used: planned
 * memory, in that every replay reuses the very buffers of the recorded run
 * (none is allocated or registered again; the recording's intermediates stay
 * allocated while the step lives).
 *
 * em_step_replay submits ONE task (kind STEP, devices/kargs.h) whose buffers
 * are those storages and whose kernel runs the recorded kernels in order on
 * the worker StarPU gives it; on a CUDA worker, runs of them are CUDA graphs
 * (devices/cuda/step.cu). Parameters that must change per replay are
 * recomputed on the host at each replay by the patch their front end
 * registered (em__capture_patch_last): an optimizer's step count and rate,
 * a random op's Philox offset. What cannot be replayed is refused at
 * em_capture_end with the reason: a host read during the capture (its
 * decision would be frozen), collectives and step fences, ops pinned to
 * another device, random streams no patch advances (SDPA dropout). */
#include "tasks/tasks_internal.h"

#include <starpu.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one recorded task keeps. */
typedef struct rec_task {
    int kind;
    int nb, first_buf;      /* its buffers: rec.bufs[first_buf .. first_buf + nb) (storage indices) */
    void *args;             /* em_kargs, or the kind's own arguments (F_OWN_ARGS) */
    size_t args_size;
    int patch;              /* -1 or index into rec.patch */
} rec_task;

typedef struct rec_patch {
    int task;
    em_capture_patch_fn fn;
    unsigned char ctx[64];
} rec_patch;

struct em_capture {
    em_placement place;
    int64_t host_reads; /* em__host_reads of the thread at em_capture_begin */
    char refused[512];  /* the first reason it cannot be replayed, or "" */
    rec_task *task;
    int n_task, cap_task;
    int32_t *bufs;      /* storage index of every buffer of every task */
    int n_bufs, cap_bufs;
    struct held_storage {
        em_tensor *t;   /* one held tensor per distinct storage */
        bool written;   /* some recorded task writes it */
    } *held;
    int n_held, cap_held;
    rec_patch *patch;
    int n_patch, cap_patch;
    uint64_t rng_reserved, rng_patched; /* Philox counters reserved during the capture / advanced by patches */
};

struct em_step {
    em_placement place;
    em_step_plan plan;
    em_step_op *ops;
    int32_t *bufs;
    em_tensor **var;       /* the STEP task's buffers: read-only storages, then written ones */
    int n_var, n_written;
    rec_patch *patch;
    int n_patch;
    union em_op_params *patch_p0; /* the recorded parameters of each patched task */
    void **args;           /* the recorded kernel arguments (owned) */
    int64_t replays;
};

static _Thread_local em_capture *tl_capture;

em_capture *em__capture_current(void) { return tl_capture; }

static bool capture_on(void)
{
    const char *v = getenv("EMBER_CAPTURE");
    return !(v && !strcmp(v, "0"));
}

static void refuse(em_capture *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(em_capture *c, const char *fmt, ...)
{
    if (c->refused[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->refused, sizeof c->refused, fmt, ap);
    va_end(ap);
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int n = *cap ? *cap * 2 : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, elem * (size_t)n);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

/* The storage index of @p t (held once per storage), marked written when @p w. */
static int storage_index(em_capture *c, em_tensor *t, bool w)
{
    for (int i = c->n_held - 1; i >= 0; i--)
        if (c->held[i].t->storage == t->storage) {
            c->held[i].written |= w;
            return i;
        }
    if (!grow((void **)&c->held, &c->cap_held, c->n_held + 1, sizeof *c->held)) return -1;
    c->held[c->n_held] = (struct held_storage){em__tensor_hold(t), w};
    return c->n_held++;
}

static bool same_placement(em_placement a, em_placement b) { return a.where == b.where && a.worker == b.worker; }

void em__capture_record(em_capture *c, const em_op *op, const em_kargs *k)
{
    if (c->refused[0]) return;
    const unsigned fl = em__optab[op->kind].flags;
    if (fl & (F_COLLECTIVE | F_NOWHERE) || op->kind == EM_OP_STEP)
        return refuse(c, "op %s (a collective, fence or step) cannot be replayed", em__optab[op->kind].name);
    if (op->token || op->after || op->nodes)
        return refuse(c, "op %s is ordered by a token or fence (data-parallel training)", em__optab[op->kind].name);
    if (op->place && !same_placement(*op->place, c->place))
        return refuse(c, "op %s runs on another device than the step", em__optab[op->kind].name);
    if (!grow((void **)&c->task, &c->cap_task, c->n_task + 1, sizeof *c->task)) goto nomem;
    rec_task *r = &c->task[c->n_task];
    memset(r, 0, sizeof *r);
    r->kind = op->kind;
    r->patch = -1;
    r->first_buf = c->n_bufs;
    if (fl & F_OWN_ARGS) {
        r->args_size = op->args_size;
        r->args = malloc(op->args_size);
        if (!r->args) goto nomem;
        memcpy(r->args, op->args, op->args_size);
        r->nb = op->n_var;
    } else {
        r->args_size = sizeof *k;
        r->args = malloc(sizeof *k);
        if (!r->args) goto nomem;
        memcpy(r->args, k, sizeof *k);
        r->nb = op->n_in + op->n_out;
    }
    if (!grow((void **)&c->bufs, &c->cap_bufs, c->n_bufs + r->nb, sizeof *c->bufs)) {
        free(r->args);
        goto nomem;
    }
    for (int j = 0; j < r->nb; j++) {
        em_tensor *t;
        bool w;
        if (fl & F_OWN_ARGS) {
            t = op->var[j];
            w = j >= op->n_var - op->n_var_w;
        } else {
            t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
            w = j >= op->n_in;
        }
        const int s = storage_index(c, t, w);
        if (s < 0) {
            free(r->args);
            goto nomem;
        }
        c->bufs[c->n_bufs++] = s;
    }
    c->n_task++;
    return;
nomem:
    refuse(c, "out of memory recording op %s", em__optab[op->kind].name);
}

void em__capture_refuse(const char *why)
{
    if (tl_capture) refuse(tl_capture, "%s", why);
}

void em__capture_patch_last(enum em_op_kind kind, em_capture_patch_fn fn, const void *ctx, size_t ctx_size)
{
    em_capture *c = tl_capture;
    if (!c || c->refused[0]) return;
    /* the op's own task: the last of its kind (a widened op's copies come after it) */
    int t = c->n_task - 1;
    while (t >= 0 && c->task[t].kind != (int)kind) t--;
    if (t < 0 || ctx_size > sizeof c->patch[0].ctx || c->task[t].patch >= 0 || (em__optab[kind].flags & F_OWN_ARGS))
        return refuse(c, "internal error: a parameter patch has no task to apply to");
    if (!grow((void **)&c->patch, &c->cap_patch, c->n_patch + 1, sizeof *c->patch))
        return refuse(c, "out of memory recording a parameter patch");
    rec_patch *p = &c->patch[c->n_patch];
    p->task = t;
    p->fn = fn;
    memset(p->ctx, 0, sizeof p->ctx);
    memcpy(p->ctx, ctx, ctx_size);
    c->task[t].patch = c->n_patch++;
}

void em__capture_rng(uint64_t reserved, uint64_t patched)
{
    em_capture *c = tl_capture;
    if (!c) return;
    c->rng_reserved += reserved;
    c->rng_patched += patched;
}

static void capture_free(em_capture *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_task; i++) free(c->task[i].args);
    for (int i = 0; i < c->n_held; i++) em__tensor_unhold(c->held[i].t);
    free(c->task);
    free(c->bufs);
    free(c->held);
    free(c->patch);
    free(c);
}

bool em_capture_enabled(void) { return capture_on(); }

em_status em_capture_begin(void)
{
    if (!em_is_initialized()) return em__set_error(EM_ERR_STATE, "em_capture_begin: runtime not initialized");
    if (tl_capture) return em__set_error(EM_ERR_STATE, "em_capture_begin: this thread is already capturing a step");
    if (em__fusion_flush) { /* ops held before the step are not part of it */
        em_status st = em__fusion_flush();
        if (st != EM_OK) return st;
    }
    em_capture *c = calloc(1, sizeof *c);
    if (!c) return em__set_error(EM_ERR_NOMEM, "em_capture_begin: out of memory");
    c->place = em__placement();
    c->host_reads = em__host_reads;
    tl_capture = c;
    return EM_OK;
}

/* Frees @p s (NULL: nothing) and what it owns: the backend's graphs, the
 * recorded arguments, the holds on its storages. */
__attribute__((weak)) void em__cuda_step_release(em_step_plan *p) { (void)p; }

static void step_release(em_step *s)
{
    if (!s) return;
    em__cuda_step_release(&s->plan);
    for (int i = 0; s->args && i < s->plan.n_ops; i++) free(s->args[i]);
    for (int i = 0; s->var && i < s->n_var; i++) em__tensor_unhold(s->var[i]);
    free(s->ops);
    free(s->bufs);
    free(s->var);
    free(s->args);
    free(s->patch);
    free(s->patch_p0);
    free(s);
}

em_step *em_capture_end(void)
{
    em_capture *c = tl_capture;
    if (!c) return em__fail(EM_ERR_STATE, "em_capture_end: no em_capture_begin on this thread");
    em_status fst = em__fusion_flush ? em__fusion_flush() : EM_OK; /* the step's last chains, recorded */
    tl_capture = NULL;
    if (fst != EM_OK) {
        capture_free(c);
        return NULL;
    }
    if (!capture_on()) refuse(c, "step capture is off (EMBER_CAPTURE=0)");
    if (em__host_reads != c->host_reads)
        refuse(c, "the step read a tensor on the host (em_to_host / em_item): a replay would repeat its first decision");
    if (c->rng_reserved != c->rng_patched)
        refuse(c, "the step draws random numbers that a replay cannot advance (fused attention's dropout)");
    if (!c->refused[0] && c->n_task == 0) refuse(c, "the step submitted no task");
    if (c->refused[0]) {
        em__set_error(EM_ERR_UNSUPPORTED, "em_capture_end: the step cannot be replayed: %s", c->refused);
        capture_free(c);
        return NULL;
    }
    em_step *s = calloc(1, sizeof *s);
    int *slot = malloc(sizeof *slot * (size_t)c->n_held);
    if (s) {
        s->ops = calloc((size_t)c->n_task, sizeof *s->ops);
        s->bufs = malloc(sizeof *s->bufs * (size_t)(c->n_bufs ? c->n_bufs : 1));
        s->var = malloc(sizeof *s->var * (size_t)c->n_held);
        s->args = calloc((size_t)c->n_task, sizeof *s->args);
        s->patch = malloc(sizeof *s->patch * (size_t)(c->n_patch ? c->n_patch : 1));
        s->patch_p0 = malloc(sizeof *s->patch_p0 * (size_t)(c->n_patch ? c->n_patch : 1));
    }
    if (!s || !slot || !s->ops || !s->bufs || !s->var || !s->args || !s->patch || !s->patch_p0) {
        free(slot);
        step_release(s); /* nothing moved into it yet */
        capture_free(c);
        return em__fail(EM_ERR_NOMEM, "em_capture_end: out of memory");
    }
    /* the STEP task's buffers: read-only storages first, then written ones */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < c->n_held; i++)
            if (c->held[i].written == (pass == 1)) {
                slot[i] = s->n_var;
                s->var[s->n_var++] = c->held[i].t; /* the hold moves to the step */
                s->n_written += pass;
            }
    for (int b = 0; b < c->n_bufs; b++) s->bufs[b] = slot[c->bufs[b]];
    for (int i = 0; i < c->n_task; i++) {
        rec_task *r = &c->task[i];
        s->args[i] = r->args; /* moves to the step */
        s->ops[i] = (em_step_op){.kind = r->kind, .nb = r->nb, .first_buf = r->first_buf, .patch = r->patch,
                                 .args = r->args};
    }
    for (int k = 0; k < c->n_patch; k++) {
        s->patch[k] = c->patch[k];
        s->patch_p0[k] = ((const em_kargs *)c->task[c->patch[k].task].args)->p;
    }
    s->n_patch = c->n_patch;
    s->place = c->place;
    s->plan.n_ops = c->n_task;
    s->plan.n_patch = c->n_patch;
    s->plan.n_bufs = s->n_var;
    s->plan.ops = s->ops;
    s->plan.bufs = s->bufs;
    free(slot);
    c->n_task = c->n_held = 0; /* their arguments and holds moved to the step */
    capture_free(c);
    em_log_msg(EM_LOG_DEBUG, "step captured: %d tasks, %d buffers (%d written), %d patched", s->plan.n_ops, s->n_var,
               s->n_written, s->n_patch);
    return s;
}

em_status em_step_replay(em_step *s)
{
    if (!s) return em__set_error(EM_ERR_INVALID, "em_step_replay: step is NULL");
    if (tl_capture) return em__set_error(EM_ERR_STATE, "em_step_replay: not while capturing a step");
    if (em__fusion_flush) { /* held ops read what the step is about to write: they run first, as submitted */
        em_status st = em__fusion_flush();
        if (st != EM_OK) return st;
    }
    const size_t np = (size_t)s->n_patch;
    em_step_args *a = malloc(sizeof *a + sizeof(union em_op_params) * (np ? np : 1));
    if (!a) return em__set_error(EM_ERR_NOMEM, "em_step_replay: out of memory");
    memset(&a->k, 0, sizeof a->k);
    a->k.kind = EM_OP_STEP;
    a->plan = &s->plan;
    a->replay = ++s->replays;
    union em_op_params *p = (union em_op_params *)(a + 1);
    for (size_t k = 0; k < np; k++) { /* in recorded order, as the eager step would */
        p[k] = s->patch_p0[k];
        s->patch[k].fn(s->patch[k].ctx, &p[k]);
    }
    a->p = p;
    em_op op = {.kind = EM_OP_STEP, .flags = EM_OPF_NO_FUSE | EM_OPF_NO_RECORD, .place = &s->place,
                .n_var = s->n_var, .var = s->var, .n_var_w = s->n_written, .args = a,
                .args_size = sizeof *a + sizeof(union em_op_params) * (np ? np : 1)};
    return em__submit(&op); /* the door owns a from here on */
}

int64_t em_step_task_count(const em_step *s) { return s ? s->plan.n_ops : -1; }

void em_step_free(em_step *s)
{
    if (!s) return;
    /* the replays use the plan: wait for them, leaving a kernel failure (the
     * sticky error) to the caller's next em_sync / host read (em_sync would
     * take it and drop it here) */
    if (s->replays > 0 && em_is_initialized()) {
        if (em__fusion_flush && em__fusion_flush() != EM_OK)
            em_log_msg(EM_LOG_WARN, "em_step_free: submitting the held element-wise ops failed: %s", em_last_error());
        /* only the step's own work: a fence after every storage its replays
         * write (each replay writes them all), then its release, which waits
         * for the fence (not for other threads' tasks) */
        void *fence = NULL;
        if (s->n_written == 0 || em__fence_signal(&fence, s->var + (s->n_var - s->n_written), s->n_written) != EM_OK)
            starpu_task_wait_for_all();
        em__fence_free(&fence);
    }
    step_release(s);
}
