/* Element-wise fusion (DESIGN.md §6, issue #17): the lazy stream.
 *
 * The door (tasks/funnel.c em__submit) offers this layer every op. A
 * fusable op — a unary, tensor-scalar or binary math kind of tasks/ops.def
 * (EW1 / EWS / EWP / EW2, not F_CMP) with every operand float32 or every
 * operand float64, one shape, a fresh contiguous output and no scheduling
 * extras — is held: its output tensor exists (shaped, in its scope,
 * recorded by autodiff) but no task writes it yet. Any other op first
 * flushes the stream, so every task that could read a held output is
 * submitted after the one task that writes it, and StarPU's data
 * dependencies order the rest. The runtime flushes before host reads, waits
 * and counts (em__fusion_flush, runtime/runtime_internal.h).
 *
 * A flush turns the held chain into one FUSED task (the contract:
 * em_fused_prog, devices/kargs.h): leaves are the chain's inputs from
 * outside it (each distinct storage + layout once), instruction i computes
 * op i from registers, and only outputs some tensor still references are
 * written — an intermediate the user already released (x = gelu(x), then
 * release) costs no memory traffic. A chain of one op is submitted as that
 * op. The stream is process-wide under one mutex, held while a flush
 * submits, so a thread that received a tensor from another always finds its
 * producer submitted or still held. */
#include "tasks/tasks_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The kinds that fuse: every EW1 / EWS / EWP / EW2 line that is not a
 * comparison. */
static const bool g_fusable_kind[EM_OP_COUNT] = {
#define EW1(E, nm, fl, fx, ix, bw) [EM_OP_##E] = !((fl) & F_CMP),
#define EW2(E, nm, fl, fx, ix, bw) [EM_OP_##E] = !((fl) & F_CMP),
#include "tasks/ops.def"
};

/* Instruction operands while a chain grows: a leaf index, or
 * EM_FUSED_MAX_LEAVES + the instruction whose result it is (renumbered to
 * registers at the flush, when the number of leaves is known). */
#define FROM_INSTR EM_FUSED_MAX_LEAVES

typedef struct stream {
    pthread_mutex_t mu;
    bool on;
    int n;                                   /* held ops */
    int n_leaf;
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    em_placement place;                      /* of the chain (the first op's) */
    int priority;
    em_capture *capture;                     /* the capture recording the chain (its ops' thread's), or NULL */
    em_op first;                             /* the first op (a chain of one runs as itself) */
    em_tensor *leaf[EM_FUSED_MAX_LEAVES];    /* held (em__tensor_hold) */
    em_tensor *out[EM_FUSED_MAX_INSTR];      /* held: op i's output */
    uint32_t dead;                           /* bit i: out[i] was seen unreferenced (it stays so: see add_locked) */
    em_fused_instr ins[EM_FUSED_MAX_INSTR];
} stream;

static stream g = {.mu = PTHREAD_MUTEX_INITIALIZER, .on = true};

_Static_assert(EM_FUSED_MAX_INSTR <= 32, "stream.dead has a bit per instruction");

static bool same_placement(em_placement a, em_placement b) { return a.where == b.where && a.worker == b.worker; }

/* Can @p op join a chain at all (whatever the chain holds)? */
static bool fusable(const em_op *op)
{
    if (!g_fusable_kind[op->kind] || op->n_out != 1 || op->token || op->after || op->kargs || op->place || op->nodes ||
        op->n_var || op->args)
        return false;
    const em_tensor *o = op->out[0];
    if ((o->dtype != EM_F32 && o->dtype != EM_F64) || o->ndim < 1 || o->ndim > EM_KARGS_MAX_DIMS ||
        em__numel(o->shape, o->ndim) <= 0 || !em__covers_storage(o))
        return false;
    for (int i = 0; i < op->n_in; i++) {
        const em_tensor *t = op->in[i];
        if (t->dtype != o->dtype || t->ndim != o->ndim || memcmp(t->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim))
            return false;
    }
    return true;
}

/* The chain's op writing @p s, or -1 (at most one op writes a storage:
 * add_locked refuses the rest). From the last op: an input is most often
 * the output of the op just before. */
static int producer(const em_storage *s)
{
    for (int i = g.n - 1; i >= 0; i--)
        if (g.out[i]->storage == s) return i;
    return -1;
}

/* Does only its creator reference @p t and its storage? Then no held tensor
 * shares that storage: every held tensor holds a reference of its own (so
 * t itself is not held) and one of its storage. */
static bool fresh(const em_tensor *t)
{
    return __atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) == 1 &&
           __atomic_load_n(&t->storage->refcount, __ATOMIC_ACQUIRE) == 1;
}

static bool same_layout(const em_tensor *a, const em_tensor *b)
{
    return a->storage == b->storage && a->offset == b->offset &&
           !memcmp(a->strides, b->strides, sizeof(int64_t) * (size_t)a->ndim);
}

static void release_all(void)
{
    for (int i = 0; i < g.n_leaf; i++) em__tensor_unhold(g.leaf[i]);
    for (int i = 0; i < g.n; i++) em__tensor_unhold(g.out[i]);
    g.n = g.n_leaf = 0;
    g.dead = 0;
}

/* Is tensor @p t referenced by anyone but the stream? */
static bool referenced(const em_tensor *t)
{
    return __atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) > 1 ||
           __atomic_load_n(&t->storage->refcount, __ATOMIC_ACQUIRE) > 1;
}

/* Submits the chain (g.mu held). */
static em_status flush_locked(void)
{
    if (g.n == 0) return EM_OK;
    em_placement place = g.place;
    em_status st = EM_OK;
    if (g.n == 1) { /* as itself: its own kernel, nothing to fuse */
        em_op op = g.first;
        op.flags |= EM_OPF_NO_FUSE | EM_OPF_NO_RECORD;
        op.place = &place;
        op.capture = g.capture ? g.capture : EM_NO_CAPTURE;
        st = em__submit(&op);
        release_all();
        return st;
    }
    em_fused_args *fa = calloc(1, sizeof *fa);
    em_tensor *var[EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT];
    if (!fa) {
        release_all();
        return em__set_error(EM_ERR_NOMEM, "out of memory creating a fused task");
    }
    em_fused_prog *p = &fa->prog;
    p->dtype = (int32_t)g.dtype;
    p->ndim = g.ndim;
    p->n_leaf = g.n_leaf;
    p->n_instr = g.n;
    p->numel = em__numel(g.shape, g.ndim);
    memcpy(p->shape, g.shape, sizeof(int64_t) * (size_t)g.ndim);
    for (int l = 0; l < g.n_leaf; l++) {
        p->leaf[l].offset = g.leaf[l]->offset;
        memcpy(p->leaf[l].strides, g.leaf[l]->strides, sizeof(int64_t) * (size_t)g.ndim);
        var[l] = g.leaf[l];
    }
    for (int i = 0; i < g.n; i++) {
        em_fused_instr in = g.ins[i];
        if (in.a >= FROM_INSTR) in.a = g.n_leaf + in.a - FROM_INSTR;
        if (in.b >= FROM_INSTR) in.b = g.n_leaf + in.b - FROM_INSTR;
        p->ins[i] = in;
    }
    /* outputs: those still referenced (at most EM_FUSED_MAX_OUT: the stream
     * flushes before an op would make more); none at all: nothing to run */
    int n_out = 0;
    for (int i = 0; i < g.n; i++)
        if (referenced(g.out[i])) {
            if (n_out == EM_FUSED_MAX_OUT) { /* add_locked's bound broken: fail loudly, write nothing out of bounds */
                free(fa);
                release_all();
                return em__set_error(EM_ERR_RUNTIME, "fusion: more than %d outputs of a chain are referenced", EM_FUSED_MAX_OUT);
            }
            p->out_reg[n_out] = g.n_leaf + i;
            var[g.n_leaf + n_out++] = g.out[i];
        }
    p->n_out = n_out;
    const int n_ops = g.n;
    if (n_out > 0) {
        em_kargs *k = &fa->k;
        k->kind = EM_OP_FUSED;
        k->n_in = 0;
        k->n_out = 1;
        k->out[0].dtype = (int32_t)g.dtype;
        k->out[0].ndim = g.ndim;
        memcpy(k->out[0].shape, g.shape, sizeof(int64_t) * (size_t)g.ndim);
        em__contiguous_strides(g.shape, g.ndim, k->out[0].strides);
        em_op op = {.kind = EM_OP_FUSED, .flags = EM_OPF_NO_FUSE | EM_OPF_NO_RECORD, .priority = g.priority,
                    .place = &place, .capture = g.capture ? g.capture : EM_NO_CAPTURE, .n_var = g.n_leaf + n_out, .var = var, .n_var_w = n_out, .args = fa,
                    .args_size = sizeof *fa};
        st = em__submit(&op); /* owns fa from the call on */
        if (st == EM_OK) {
            __atomic_add_fetch(&em__fused_tasks, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&em__ops_fused, n_ops, __ATOMIC_RELAXED);
        }
    } else {
        free(fa);
    }
    release_all();
    return st;
}

/* Adds @p op to the chain (g.mu held; fusable(op)). Returns false when it
 * cannot join this chain (flush, then it starts the next one). */
static bool add_locked(em_op *op, em_placement place, em_capture *capture)
{
    const em_tensor *o = op->out[0];
    if (g.n > 0 && (g.n == EM_FUSED_MAX_INSTR || o->dtype != g.dtype || o->ndim != g.ndim || capture != g.capture ||
                    memcmp(o->shape, g.shape, sizeof(int64_t) * (size_t)g.ndim) || !same_placement(place, g.place) ||
                    op->priority != g.priority))
        return false;
    /* the output must be a storage the chain neither reads nor writes (a
     * fresh one is neither: no scan) */
    if (!fresh(o)) {
        if (producer(o->storage) >= 0) return false;
        for (int l = 0; l < g.n_leaf; l++)
            if (g.leaf[l]->storage == o->storage) return false;
    }
    /* the outputs kept at the flush: at most EM_FUSED_MAX_OUT (counted as
     * if every held output were kept). An output seen unreferenced is not
     * looked at again: only the stream holds a pointer to it, so nobody can
     * reference it any more (the count at the flush relies on that too). */
    if (g.n >= EM_FUSED_MAX_OUT) {
        int kept = 0;
        for (uint32_t m = ((1u << g.n) - 1) & ~g.dead; m; m &= m - 1) { /* g.n < EM_FUSED_MAX_INSTR here */
            const int i = __builtin_ctz(m);
            if (referenced(g.out[i]))
                kept++;
            else
                g.dead |= 1u << i;
        }
        if (kept >= EM_FUSED_MAX_OUT) return false;
    }
    int reg[2] = {0, 0}, new_leaf = 0;
    em_tensor *leaf_add[2] = {NULL, NULL};
    for (int i = 0; i < op->n_in; i++) {
        em_tensor *t = op->in[i];
        const int j = producer(t->storage);
        if (j >= 0) { /* a held output: as a register when it is that very layout */
            if (!same_layout(t, g.out[j])) return false;
            reg[i] = FROM_INSTR + j;
            continue;
        }
        int l = 0;
        while (l < g.n_leaf && !same_layout(g.leaf[l], t)) l++;
        if (l == g.n_leaf) {
            if (i == 1 && leaf_add[0] && same_layout(leaf_add[0], t)) {
                reg[1] = reg[0];
                continue;
            }
            if (g.n_leaf + new_leaf == EM_FUSED_MAX_LEAVES) return false;
            l = g.n_leaf + new_leaf;
            leaf_add[new_leaf++] = t;
        }
        reg[i] = l;
    }
    if (g.n == 0) {
        g.first = *op;
        g.dtype = o->dtype;
        g.ndim = o->ndim;
        memcpy(g.shape, o->shape, sizeof(int64_t) * (size_t)o->ndim);
        g.place = place;
        g.priority = op->priority;
        g.capture = capture;
    }
    for (int k = 0; k < new_leaf; k++) g.leaf[g.n_leaf++] = em__tensor_hold(leaf_add[k]);
    if (g.n == 0) /* the first op's inputs are leaves: the held ones (the caller's may be temporaries) */
        for (int i = 0; i < op->n_in; i++) {
            g.first.in[i] = g.leaf[reg[i]];
            g.first.orig_in[i] = NULL; /* autodiff's, already recorded: not kept past the call */
        }
    em_fused_instr *in = &g.ins[g.n];
    memset(in, 0, sizeof *in);
    in->kind = op->kind;
    in->a = reg[0];
    in->b = op->n_in > 1 ? reg[1] : reg[0];
    in->sa = op->p.s.a;
    in->sb = op->p.s.b;
    g.out[g.n++] = em__tensor_hold(op->out[0]);
    return true;
}

static em_status offer(em_op *op, bool *taken)
{
    *taken = false;
    const unsigned fl = em__optab[op->kind].flags;
    if (fl & F_VIEW) return EM_OK; /* no task: a view of a held output is fine */
    pthread_mutex_lock(&g.mu);
    em_status st = EM_OK;
    if (g.on && fusable(op)) {
        const em_placement place = em__placement();
        em_capture *capture = em__capture_current();
        if (!add_locked(op, place, capture)) {
            st = flush_locked();
            if (st == EM_OK && !add_locked(op, place, capture)) st = em__set_error(EM_ERR_RUNTIME, "fusion: op %s cannot start a chain", em__optab[op->kind].name);
        }
        *taken = st == EM_OK;
    } else {
        st = flush_locked();
    }
    pthread_mutex_unlock(&g.mu);
    return st;
}

static em_status flush(void)
{
    pthread_mutex_lock(&g.mu);
    em_status st = flush_locked();
    pthread_mutex_unlock(&g.mu);
    return st;
}

bool em_set_fusion(bool on)
{
    pthread_mutex_lock(&g.mu);
    const bool was = g.on;
    if (!on && g.n > 0 && flush_locked() != EM_OK)
        em_log_msg(EM_LOG_WARN, "em_set_fusion: submitting the held element-wise ops failed: %s", em_last_error());
    g.on = on;
    pthread_mutex_unlock(&g.mu);
    return was;
}

bool em_fusion_enabled(void)
{
    pthread_mutex_lock(&g.mu);
    const bool on = g.on;
    pthread_mutex_unlock(&g.mu);
    return on;
}

/* em_init: EMBER_FUSION=0 makes off the default (any other value: on). */
static em_status fusion_init(void)
{
    const char *v = getenv("EMBER_FUSION");
    pthread_mutex_lock(&g.mu);
    g.on = !(v && !strcmp(v, "0"));
    pthread_mutex_unlock(&g.mu);
    return EM_OK;
}

__attribute__((constructor)) static void register_fusion(void)
{
    em__fusion_offer = offer;
    em__fusion_flush = flush;
    static const em_runtime_hooks hooks = {.name = "fusion", .order = 30, .init = fusion_init};
    em__runtime_register(&hooks);
}
