/* The Learner: epochs of train + validation, metrics, progress, metrics log,
 * checkpoints (every epoch + best), early stopping, resume. */
#include "ember/train.h"
#include "ember/amp.h"
#include "ember/dist.h" /* [dist] */
#include "runtime/runtime_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

em_learner_config em_learner_config_default(void)
{
    return (em_learner_config){.epochs = 10, .progress = -1, .loss = em_cross_entropy_opts_default(),
                               .precision = EM_PRECISION_F32, .eval_iters = 100};
}

static const char *const PRECISION_NAMES[EM_PRECISION_COUNT] = {"f32", "tf32", "bf16", "f16"};

const char *em_precision_name(em_precision p)
{
    return (unsigned)p < EM_PRECISION_COUNT ? PRECISION_NAMES[p] : NULL;
}

em_status em_precision_parse(const char *s, em_precision *out)
{
    static const struct {
        const char *name;
        em_precision p;
    } names[] = {{"f32", EM_PRECISION_F32},   {"fp32", EM_PRECISION_F32}, {"float32", EM_PRECISION_F32},
                 {"tf32", EM_PRECISION_TF32}, {"bf16", EM_PRECISION_BF16}, {"bfloat16", EM_PRECISION_BF16},
                 {"f16", EM_PRECISION_F16},   {"fp16", EM_PRECISION_F16}, {"float16", EM_PRECISION_F16},
                 {"half", EM_PRECISION_F16}};
    if (!out) return em__set_error(EM_ERR_INVALID, "em_precision_parse: out is NULL");
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].p;
            return EM_OK;
        }
    return em__set_error(EM_ERR_INVALID, "unknown precision '%s' (expected f32, tf32, bf16 or f16)", s ? s : "(null)");
}

/* The autocast dtype of a precision (EM_F32: no region). */
static em_dtype precision_autocast(em_precision p)
{
    return p == EM_PRECISION_BF16 ? EM_BF16 : p == EM_PRECISION_F16 ? EM_F16 : EM_F32;
}

#define EM_LEARNER_MAX_REPLICAS 64

/* Device-side running sums, read on the host only when printed. */
typedef struct running {
    em_tensor *loss_sum; /* f32 0-d: sum of per-batch mean loss * batch size */
    em_tensor *correct;  /* i64 0-d */
    em_tensor *correct5; /* i64 0-d */
    int64_t samples;
} running;

/* [N] bool: row i of the [N, C] logits is all finite (x - x == 0 exactly when x is finite). A sample
 * whose logits are not all finite counts as wrong for top-1 and top-5 (the argmax of a NaN row is
 * some class, and no logit is greater than a NaN target) and has no predicted class. */
static em_tensor *rows_finite(em_tensor *logits)
{
    em_tensor *lg = em_detach(logits);
    return em_all(em_eq_scalar(em_sub(lg, lg), 0.0), (const int[]){1}, 1, false);
}

/* Adds a batch to the running sums. Called inside the step's scope: the new
 * sums get an extra reference of ours so they outlive it. */
/* Adds a batch to the running sums. With @p top5 (validation) a sample whose
 * logits are not all finite counts as wrong (rows_finite); the training
 * batches leave that check out (four more tasks on every step, the hot path):
 * there top-1 is the argmax's, as PyTorch computes it, and a diverged run is
 * reported by its non-finite loss (the Learner's warning). */
/* With @p in_place (a captured step's epoch: the replays must add to the
 * same tensors) existing sums are updated in place (em_copy_) instead of
 * replaced: one more copy per sum. */
static void running_add(running *r, em_tensor *loss, em_tensor *logits, em_tensor *y, int64_t bsz, bool top5, bool in_place)
{
    em_tensor *l = em_mul_scalar(em_cast(em_detach(loss), EM_F32), (double)bsz);
    em_tensor *finite = top5 ? rows_finite(logits) : NULL;
    em_tensor *eq = em_eq(em_argmax(logits, 1, false), y);
    em_tensor *hit = em_sum_all(finite ? em_logical_and(eq, finite) : eq);
    if (in_place && r->loss_sum && r->correct && !top5) {
        if (em_copy_(r->loss_sum, em_add(r->loss_sum, l)) == EM_OK) (void)em_copy_(r->correct, em_add(r->correct, hit));
        r->samples += bsz;
        return;
    }
    em_tensor *nl = em_tensor_retain(r->loss_sum ? em_add(r->loss_sum, l) : l);
    em_tensor *nc = em_tensor_retain(r->correct ? em_add(r->correct, hit) : hit);
    em_tensor *n5 = NULL;
    if (top5) {
        /* rank of the target logit = number of logits strictly greater; top-5 hit when rank < 5 */
        int64_t yshape[2] = {bsz, 1};
        em_tensor *target_logit = em_gather(logits, 1, em_reshape(y, yshape, 2));
        em_tensor *rank = em_sum(em_gt(logits, target_logit), (const int[]){1}, 1, false);
        em_tensor *h5 = em_sum_all(em_logical_and(em_lt_scalar(rank, 5.0), finite));
        n5 = em_tensor_retain(r->correct5 ? em_add(r->correct5, h5) : h5);
    }
    em_tensor_release(r->loss_sum);
    em_tensor_release(r->correct);
    em_tensor_release(r->correct5);
    r->loss_sum = nl;
    r->correct = nc;
    r->correct5 = n5;
    r->samples += bsz;
}

/* Sums of the replicas' running sums (one per replica; n = 1 without
 * replicas) on the host: {loss_sum, correct, correct5}; false on a read error. */
static bool running_sums(const running *r, int n, double v[3], int64_t *samples)
{
    v[0] = v[1] = v[2] = 0;
    *samples = 0;
    for (int k = 0; k < n; k++) {
        double x = 0;
        *samples += r[k].samples;
        if (r[k].loss_sum) {
            if (em_item(r[k].loss_sum, &x) != EM_OK) return false;
            v[0] += x;
        }
        if (r[k].correct) {
            if (em_item(r[k].correct, &x) != EM_OK) return false;
            v[1] += x;
        }
        if (r[k].correct5) {
            if (em_item(r[k].correct5, &x) != EM_OK) return false;
            v[2] += x;
        }
    }
    return true;
}

static void running_read(const running *r, int n, double *loss, double *acc, double *top5)
{
    double v[3];
    int64_t samples;
    *loss = *acc = NAN;
    if (top5) *top5 = NAN;
    if (!running_sums(r, n, v, &samples) || samples == 0) return;
    *loss = v[0] / (double)samples;
    *acc = v[1] / (double)samples;
    if (top5) *top5 = v[2] / (double)samples;
}

/* [dist] Epoch-end read of the sums of ALL ranks (a collective when
 * distributed: every rank calls it at the same point, even after a local
 * failure, so that nobody waits forever). *samples gets the global count. */
static void running_read_global(const running *r, int n, bool ok, double *loss, double *acc, double *top5, double *samples)
{
    if (em_dist_world_size() <= 1) {
        int64_t cnt = 0;
        for (int k = 0; k < n; k++) cnt += r[k].samples;
        if (ok) running_read(r, n, loss, acc, top5);
        *samples = (double)cnt;
        return;
    }
    double v[4] = {0, 0, 0, 0}, s3[3];
    int64_t cnt = 0;
    if (ok && running_sums(r, n, s3, &cnt)) memcpy(v, s3, sizeof s3);
    else for (int k = 0; k < n; k++) cnt += r[k].samples;
    v[3] = (double)cnt;
    *loss = *acc = NAN;
    if (top5) *top5 = NAN;
    *samples = 0;
    if (em_dist_allreduce_sum(v, 4) != EM_OK || v[3] <= 0) return;
    *loss = v[0] / v[3];
    *acc = v[1] / v[3];
    if (top5) *top5 = v[2] / v[3];
    *samples = v[3];
}

static void running_free(running *r, int n)
{
    for (int k = 0; k < n; k++) {
        em_tensor_release(r[k].loss_sum);
        em_tensor_release(r[k].correct);
        em_tensor_release(r[k].correct5);
        memset(&r[k], 0, sizeof r[k]);
    }
}

/* Columns of the terminal behind @p f: TIOCGWINSZ on its descriptor, else
 * $COLUMNS, else 80. */
static int term_width(FILE *f)
{
    struct winsize ws;
    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    char *end;
    long v = c && *c ? strtol(c, &end, 10) : 0;
    if (v > 0 && v < 10000 && !*end) return (int)v;
    return 80;
}

/* The progress bar: one line, redrawn in place with \r, that fits the
 * terminal: at most width - 1 characters (a character in the last column
 * makes some terminals wrap), padded with blanks over the previous one. The
 * bar shrinks first, then the timings and the loss go. */
static void progress(FILE *f, const char *phase, int64_t epoch, int64_t epochs, int64_t done, int64_t total, double elapsed,
                     double loss)
{
    int w = term_width(f) - 1;
    if (w > 400) w = 400;
    double frac = total > 0 ? (double)done / (double)total : 1.0;
    double eta = frac > 0 ? elapsed * (1.0 - frac) / frac : 0;
    char head[64], tail[3][128], line[512];
    snprintf(head, sizeof head, "%s %lld/%lld ", phase, (long long)epoch, (long long)epochs);
    snprintf(tail[0], sizeof tail[0], " %lld/%lld  loss %.4f  %.1fs  ETA %.1fs", (long long)done, (long long)total, loss, elapsed, eta);
    snprintf(tail[1], sizeof tail[1], " %lld/%lld  loss %.4f", (long long)done, (long long)total, loss);
    snprintf(tail[2], sizeof tail[2], " %lld/%lld", (long long)done, (long long)total);
    const int hl = (int)strlen(head), min_bar = 10, max_bar = 30;
    int t = 0, n;
    while (t < 2 && hl + 2 + min_bar + (int)strlen(tail[t]) > w) t++;
    int room = w - hl - 2 - (int)strlen(tail[t]);
    if (room >= min_bar) {
        int bw = room < max_bar ? room : max_bar, fill = (int)(frac * bw);
        char b[64];
        for (int i = 0; i < bw; i++) b[i] = i < fill ? '#' : (i == fill ? '>' : '.');
        b[bw] = 0;
        n = snprintf(line, sizeof line, "%s[%s]%s", head, b, tail[t]);
    } else { /* too narrow for a bar: as much of "phase e/E d/T" as fits */
        n = snprintf(line, sizeof line, "%s%s", head, tail[2] + 1);
    }
    if (n > w) n = w;
    if (n < 0) n = 0;
    line[n] = 0;
    fprintf(f, "\r%s%*s", line, w - n, "");
    fflush(f);
}

/* Blanks the progress line (the epoch line is printed in its place). */
static void progress_clear(FILE *f)
{
    int w = term_width(f) - 1;
    if (w > 400) w = 400;
    fprintf(f, "\r%*s\r", w, "");
    fflush(f);
}

/* Replica k's share of a batch of B samples split over n replicas:
 * contiguous, sizes differ by at most one. */
static void share_of(int64_t B, int n, int k, int64_t *lo, int64_t *cnt)
{
    int64_t base = B / n, extra = B % n;
    *cnt = base + (k < extra ? 1 : 0);
    *lo = (int64_t)k * base + (k < extra ? k : extra);
}

/* [dist] One step's work for replica k (or the model alone: rep NULL). */
typedef struct share_job {
    em_module *model;           /* without replicas */
    em_optim *opt;              /* replica 0's / the model's */
    const em_batch *b;
    const em_learner_config *cfg;
    bool train;
    running *r;                 /* [R] */
    em_grads **g;               /* [R] */
    em_tensor **params;         /* [R][np] */
    int np;
    int64_t *confusion;
    int64_t num_classes;
    em_dtype autocast;          /* EM_BF16 / EM_F16: forward and loss in an autocast region; EM_F32: none */
    em_grad_scaler *scaler;     /* f16: loss scaling (one model, no replicas), else NULL */
    em_tensor *x_in, *y_in;     /* the captured step's inputs instead of the batch's, or NULL */
    bool in_place_sums;         /* running sums updated in place (running_add) */
} share_job;

/* Forward, loss, backward and running metrics of replica k's share of the
 * batch (em_replicas_run: on the replica's own thread and device). */
static em_status share_forward_backward(em_replicas *rep, int k, void *ctx)
{
    const share_job *j = ctx;
    const int R = rep ? em_replicas_count(rep) : 1;
    const em_batch *b = j->b;
    int64_t lo, cnt;
    share_of(b->size, R, k, &lo, &cnt);
    if (cnt == 0) { /* fewer samples than replicas: this one contributes nothing */
        if (j->train && !(j->g[k] = em_grads_new())) return em_last_status();
        return EM_OK;
    }
    em_status st = EM_OK;
    em_scope_begin();
    if (!j->train) em_no_grad_begin();
    em_batch sub = *b;
    sub.size = cnt;
    sub.x = b->x + lo * b->num_features;
    sub.y = b->y + lo;
    if (b->indices) sub.indices = b->indices + lo;
    em_tensor *x = j->x_in, *y = j->y_in;
    if (!x) st = em_batch_to_tensors(&sub, &x, &y);
    /* mixed precision: forward and loss in an autocast region of this thread (a replica's own) */
    bool opened = false; /* only a region this step opened is closed (not the caller's, if begin failed) */
    if (st == EM_OK && j->autocast != EM_F32) opened = (st = em_autocast_begin(j->autocast)) == EM_OK;
    em_tensor *logits = st == EM_OK ? em_module_forward(rep ? em_replicas_model(rep, k) : j->model, x) : NULL;
    em_tensor *loss = logits ? em_cross_entropy(logits, y, &j->cfg->loss) : NULL;
    if (opened) em_autocast_end();
    if (!loss) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
    if (st == EM_OK && j->train) {
        /* [dist] weight by the share so the replicas' mean is the whole batch's gradient */
        em_tensor *l = R > 1 && cnt * R != b->size ? em_mul_scalar(loss, (double)(cnt * R) / (double)b->size) : loss;
        if (l && j->scaler) l = em_grad_scaler_scale(j->scaler, l); /* f16: backward of loss * scale */
        j->g[k] = l ? em_backward(l) : NULL;
        if (!j->g[k]) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
    }
    if (st == EM_OK) running_add(&j->r[k], loss, logits, y, cnt, !j->train, j->in_place_sums);
    if (st == EM_OK && j->confusion) {
        int64_t *pred = malloc(sizeof *pred * (size_t)cnt);
        /* a sample with non-finite logits has no predicted class (-1): it is not in the matrix */
        em_tensor *am = em_masked_fill(em_argmax(logits, 1, false), em_logical_not(rows_finite(logits)), -1.0);
        if (pred && am && em_to_host(am, pred, sizeof *pred * (size_t)cnt) == EM_OK)
            for (int64_t i = 0; i < cnt; i++)
                if (sub.y[i] >= 0 && sub.y[i] < j->num_classes && pred[i] >= 0 && pred[i] < j->num_classes)
                    j->confusion[sub.y[i] * j->num_classes + pred[i]]++;
        free(pred);
    }
    if (!j->train) em_no_grad_end();
    em_scope_end();
    return st;
}

/* Clipping and the optimizer step of replica k (after the all-reduce). */
static em_status share_step(em_replicas *rep, int k, void *ctx)
{
    const share_job *j = ctx;
    em_optim *o = rep ? em_replicas_optim(rep, k) : j->opt;
    em_status st = EM_OK;
    em_scope_begin();
    /* f16: the gradients are unscaled before clipping (PyTorch's recipe: scaler.unscale_, clip, scaler.step) */
    if (j->scaler && j->cfg->clip_grad_norm > 0) st = em_grad_scaler_unscale(j->scaler, o, j->g[k]);
    /* clipping on the device: the host queues the optimizer step without
     * waiting for the norm (the scope owns the total) */
    if (st == EM_OK && j->cfg->clip_grad_norm > 0 &&
        !em_clip_grad_norm_tensor(j->g[k], j->params + (size_t)k * (size_t)j->np, j->np, j->cfg->clip_grad_norm, 2.0))
        st = em_last_status();
    if (st == EM_OK && k > 0) st = em_optim_set_lr(o, em_optim_get_lr(j->opt)); /* the scheduler drives replica 0 */
    if (st == EM_OK && j->scaler) {
        /* one host read of the non-finite count; a step with inf/NaN gradients is skipped */
        st = em_grad_scaler_step(j->scaler, o, j->g[k], NULL);
        if (st == EM_OK) st = em_grad_scaler_update(j->scaler);
    } else if (st == EM_OK) {
        st = em_optim_step(o, j->g[k]);
    }
    em_scope_end();
    return st;
}

/* Step capture (DESIGN.md §6; em_capture_begin, include/ember/core.h). In a
 * training epoch of one model in one process without loss scaling, the
 * first step runs eagerly (the warm-up: optimizer state, pooled buffers),
 * the second is captured while it runs, and every later batch of the
 * captured size is a replay: the batch copied into the captured inputs, one
 * STEP task. A batch of another size (an epoch's last) runs eagerly; a step
 * that cannot be captured runs eagerly from then on (EMBER_LOG=debug says
 * why). EMBER_CAPTURE=0 turns it off. The running sums are then updated in
 * place, so that the replays add to them. */
typedef struct step_capture {
    bool on;
    em_step *step;
    em_tensor *x, *y; /* the step's inputs (ours) */
    int64_t size;     /* its batch size */
} step_capture;

static em_status capture_inputs(step_capture *c, const em_batch *b)
{
    em_scope_begin();
    em_tensor *x = NULL, *y = NULL;
    em_status st = em_batch_to_tensors(b, &x, &y);
    if (st == EM_OK) {
        c->x = em_tensor_retain(x);
        c->y = em_tensor_retain(y);
        c->size = b->size;
    }
    em_scope_end();
    return st;
}

static em_status replay_step(step_capture *c, const em_batch *b, running *r)
{
    em_scope_begin();
    em_tensor *x = NULL, *y = NULL;
    em_status st = em_batch_to_tensors(b, &x, &y);
    if (st == EM_OK) st = em_copy_(c->x, x);
    if (st == EM_OK) st = em_copy_(c->y, y);
    if (st == EM_OK) st = em_step_replay(c->step);
    if (st == EM_OK) r->samples += b->size;
    em_scope_end();
    return st;
}

static void capture_free(step_capture *c)
{
    em_step_free(c->step);
    em_tensor_release(c->x);
    em_tensor_release(c->y);
    memset(c, 0, sizeof *c);
}

/* One pass over @p data. train: optimizer steps; else no-grad evaluation.
 * With cfg->replicas, every batch is split over the replicas, each driven by
 * its own thread (em_replicas_run); r holds one running sum per replica. */
static em_status run_epoch(em_module *model, em_optim *opt, em_lr_scheduler *sched, em_loader *data, const em_learner_config *cfg,
                           bool train, int64_t epoch, int64_t *step, running *r, int64_t *confusion, int64_t num_classes,
                           bool bar, FILE *log, em_grad_scaler *scaler)
{
    em_replicas *rep = cfg->replicas; /* [dist] */
    const int R = rep ? em_replicas_count(rep) : 1;
    em_status st = em_loader_start_epoch(data, epoch - 1);
    if (st != EM_OK) return st;
    for (int k = 0; k < R; k++) em_module_train(rep ? em_replicas_model(rep, k) : model, train);
    if (!train) em_no_grad_begin();
    int64_t total = em_loader_num_batches(data), done = 0;
    int64_t report_every = total / 10 > 0 ? total / 10 : 1;
    double t0 = now_s();
    share_job job = {.model = model, .opt = opt, .cfg = cfg, .train = train, .r = r, .confusion = confusion, .num_classes = num_classes,
                     .autocast = precision_autocast(cfg->precision), .scaler = train ? scaler : NULL};
    job.g = calloc((size_t)R, sizeof *job.g);
    if (!job.g) return em__set_error(EM_ERR_NOMEM, "out of memory");
    if (train && (cfg->clip_grad_norm > 0 || em_dist_world_size() > 1)) { /* [dist] params for the all-reduce */
        job.np = em_module_num_param_tensors(model);
        job.params = malloc(sizeof *job.params * (size_t)R * (size_t)(job.np ? job.np : 1));
        if (!job.params) {
            free(job.g);
            return em__set_error(EM_ERR_NOMEM, "out of memory");
        }
        for (int k = 0; k < R; k++)
            em_module_parameters(rep ? em_replicas_model(rep, k) : model, job.params + (size_t)k * (size_t)job.np, job.np);
    }
    step_capture cap = {.on = train && R == 1 && em_dist_world_size() <= 1 && !job.scaler && em_capture_enabled()};
    job.in_place_sums = cap.on;
    const em_batch *b = NULL;
    /* cfg->stop_flag: read between steps; [dist] not with several ranks (they would have to agree on the step) */
    const bool can_stop = cfg->stop_flag && em_dist_world_size() <= 1;
    for (;;) {
        if (can_stop && *cfg->stop_flag) {
            st = em__set_error(EM_ERR_INTERRUPTED, "interrupted in epoch %lld (%s, after %lld of %lld batches)", (long long)epoch,
                               train ? "training" : "validation", (long long)done, (long long)total);
            break;
        }
        if (!(b = em_loader_next(data))) break;
        job.b = b;
        if (cap.step && b->size == cap.size) { /* a replay of the captured step */
            st = replay_step(&cap, b, r);
        } else {
            bool capturing = cap.on && !cap.step && done == 1;
            if (capturing) {
                st = capture_inputs(&cap, b);
                if (st == EM_OK && em_capture_begin() != EM_OK) { /* eagerly, then (e.g. the caller captures) */
                    em_log_msg(EM_LOG_DEBUG, "learner: training steps run eagerly: %s", em_last_error());
                    em_clear_error();
                    capturing = cap.on = false;
                }
                job.x_in = capturing ? cap.x : NULL;
                job.y_in = capturing ? cap.y : NULL;
            }
            if (st == EM_OK)
                st = rep ? em_replicas_run(rep, share_forward_backward, &job) : share_forward_backward(NULL, 0, &job);
            if (train && st == EM_OK) {
                /* [dist] average gradients across replicas / ranks: submits reduction tasks, does not wait */
                em_scope_begin();
                if (R > 1) st = em_replicas_allreduce_grads(rep, job.g);
                else if (em_dist_world_size() > 1) st = em_dist_allreduce_grads(job.g[0], job.params, job.np);
                em_scope_end();
                if (st == EM_OK) st = rep ? em_replicas_run(rep, share_step, &job) : share_step(NULL, 0, &job);
            }
            if (capturing) { /* begun: end it, whatever the step's status */
                job.x_in = job.y_in = NULL;
                cap.step = em_capture_end();
                if (!cap.step) { /* the step ran eagerly: it is only not replayable */
                    if (st == EM_OK) {
                        em_log_msg(EM_LOG_DEBUG, "learner: training steps run eagerly: %s", em_last_error());
                        em_clear_error();
                    }
                    cap.on = false;
                }
            }
        }
        if (train && st == EM_OK) {
            (*step)++;
            if (sched && cfg->sched_per_step) em_lr_scheduler_step(sched, opt);
        }
        for (int k = 0; k < R; k++) {
            em_grads_free(job.g[k]);
            job.g[k] = NULL;
        }
        if (st != EM_OK) break;
        done++;
        if (log && bar && (done == 1 || done % report_every == 0 || done == total)) { /* each redraw reads the loss: a sync */
            double l, a;
            running_read(r, R, &l, &a, NULL);
            progress(log, train ? "train" : "valid", epoch, cfg->epochs, done, total, now_s() - t0, l);
        }
    }
    if (st == EM_OK && em_last_status() < 0 && !b) st = em_last_status(); /* loader error */
    capture_free(&cap);
    if (bar && log) progress_clear(log);
    free(job.params);
    free(job.g);
    if (!train) em_no_grad_end();
    return st;
}

/* mkdir -p */
static em_status ensure_dir(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return em__set_error(EM_ERR_INVALID, "output directory path is too long");
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return em__set_error(EM_ERR_IO, "cannot create output directory %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) == 0 || errno == EEXIST) return EM_OK;
    return em__set_error(EM_ERR_IO, "cannot create output directory %s: %s", dir, strerror(errno));
}

static em_status append_metrics(const char *dir, const em_epoch_metrics *m)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    struct stat sb;
    bool fresh = stat(path, &sb) != 0 || sb.st_size == 0;
    FILE *f = fopen(path, "a");
    if (!f) return em__set_error(EM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fresh) fprintf(f, "epoch,train_loss,train_accuracy,val_loss,val_accuracy,val_top5,lr,samples_per_s,epoch_time_s\n");
    fprintf(f, "%lld,%.6f,%.6f,%.6f,%.6f,%.6f,%.8g,%.1f,%.3f\n", (long long)m->epoch, m->train_loss, m->train_accuracy,
            m->val_loss, m->val_accuracy, m->val_top5, m->lr, m->samples_per_s, m->epoch_time_s);
    return fclose(f) == 0 ? EM_OK : em__set_error(EM_ERR_IO, "cannot write %s", path);
}

/* ---- run folders ---- */

static const char *const RUN_FILES[] = {"checkpoint.safetensors", "best.safetensors", "metrics.csv", "loss.png",
                                        "accuracy.png", "loss.svg", "accuracy.svg", NULL};

const char *const *em_run_files(void) { return RUN_FILES; }

bool em_run_dir_holds_run(const char *dir, char *found, size_t nfound)
{
    if (found && nfound) found[0] = 0;
    if (!dir) return false;
    for (int i = 0; RUN_FILES[i]; i++) {
        char path[4096];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s", dir, RUN_FILES[i]) >= (int)sizeof path) continue;
        if (lstat(path, &sb) == 0) {
            if (found && nfound) snprintf(found, nfound, "%s", RUN_FILES[i]);
            return true;
        }
    }
    return false;
}

int em_run_dir_lock(const char *dir)
{
    if (!dir || !*dir) return em__set_error(EM_ERR_INVALID, "em_run_dir_lock: no folder"), -1;
    if (ensure_dir(dir) != EM_OK) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/.ember-lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return em__set_error(EM_ERR_IO, "cannot create %s: %s", path, strerror(errno)), -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            return em__set_error(EM_ERR_STATE, "%s is in use by another run (pid %s)", dir, pid[0] ? pid : "?"), -1;
        return em__set_error(EM_ERR_IO, "cannot lock %s: %s", path, strerror(e)), -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        int e = errno;
        close(fd);
        return em__set_error(EM_ERR_IO, "cannot write %s: %s", path, strerror(e)), -1;
    }
    return fd;
}

/* "<run file>.tmp.XXXXXX": the name mkstemp gives em_safetensors_save's and
 * trim_metrics' temporaries (six letters or digits). */
static bool is_ember_tmp(const char *name)
{
    for (int i = 0; RUN_FILES[i]; i++) {
        size_t n = strlen(RUN_FILES[i]);
        if (strncmp(name, RUN_FILES[i], n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) continue;
        const char *x = name + n + 5;
        if (strlen(x) != 6) continue;
        bool ok = true;
        for (int k = 0; k < 6; k++)
            if (!((x[k] >= 'a' && x[k] <= 'z') || (x[k] >= 'A' && x[k] <= 'Z') || (x[k] >= '0' && x[k] <= '9'))) ok = false;
        if (ok) return true;
    }
    return false;
}

int em_run_dir_remove_stale_tmp(const char *dir, FILE *log)
{
    if (!dir) return em__set_error(EM_ERR_INVALID, "em_run_dir_remove_stale_tmp: dir is NULL");
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : em__set_error(EM_ERR_IO, "cannot read folder %s: %s", dir, strerror(errno));
    int removed = 0;
    em_status st = EM_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_ember_tmp(e->d_name)) continue;
        char path[4096];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (unlink(path) != 0) {
            st = em__set_error(EM_ERR_IO, "cannot remove stale temporary file %s: %s", path, strerror(errno));
            break;
        }
        removed++;
        if (log) fprintf(log, "removed %s (a temporary file left by an interrupted write)\n", path);
    }
    closedir(d);
    return st != EM_OK ? (int)st : removed;
}

int em_run_dir_clear(const char *dir)
{
    if (!dir) return em__set_error(EM_ERR_INVALID, "em_run_dir_clear: dir is NULL");
    int tmp = em_run_dir_remove_stale_tmp(dir, NULL);
    if (tmp < 0) return tmp;
    int removed = tmp;
    for (int i = 0; RUN_FILES[i]; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, RUN_FILES[i]) >= (int)sizeof path)
            return em__set_error(EM_ERR_INVALID, "run folder path %s is too long", dir);
        if (unlink(path) == 0) removed++;
        else if (errno != ENOENT) return em__set_error(EM_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    }
    return removed;
}

/* With --resume: drops the rows of metrics.csv of epochs after @p epoch (the
 * checkpoint's), rewriting the file atomically (metrics.csv.tmp.XXXXXX, then a
 * rename). An absent file, or one with nothing to drop, is left untouched. */
static em_status trim_metrics(const char *dir, int64_t epoch, FILE *log, const char *unit)
{
    char path[4096], tmpbuf[4096 + 16], *tmp = NULL;
    if (snprintf(path, sizeof path, "%s/metrics.csv", dir) >= (int)sizeof path)
        return em__set_error(EM_ERR_INVALID, "output directory path is too long");
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? EM_OK : em__set_error(EM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return em__set_error(EM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1), *out = malloc(n + 1);
    if (!buf || !out) {
        fclose(f);
        free(buf);
        free(out);
        return em__set_error(EM_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    int rerr = ferror(f);
    fclose(f);
    if (rerr || got != n) {
        free(buf);
        free(out);
        return em__set_error(EM_ERR_IO, "cannot read %s", path);
    }
    buf[n] = 0;
    size_t w = 0;
    int64_t dropped = 0;
    for (char *line = buf; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) + 1 : strlen(line);
        char *end;
        errno = 0;
        long long e = strtoll(line, &end, 10);
        bool row = end != line && *end == ',' && !errno;
        if (row && e > epoch) dropped++;
        else {
            memcpy(out + w, line, len);
            w += len;
        }
        line += len;
    }
    free(buf);
    em_status st = EM_OK;
    int fd = -1;
    if (!dropped) goto done;
    snprintf(tmpbuf, sizeof tmpbuf, "%s.tmp.XXXXXX", path); /* the name em_run_dir_remove_stale_tmp knows */
    fd = mkstemp(tmpbuf);
    if (fd < 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot create temporary file %s: %s", path, tmpbuf, strerror(errno));
        goto done;
    }
    tmp = tmpbuf;
    for (size_t o = 0; o < w;) {
        ssize_t k = write(fd, out + o, w - o);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            st = em__set_error(EM_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
            goto done;
        }
        o += (size_t)k;
    }
    if (fchmod(fd, sb.st_mode & 07777) != 0 || fsync(fd) != 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot sync %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0 || rename(tmp, path) != 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot replace it with %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    tmp = NULL; /* renamed */
    if (log) fprintf(log, "%s: dropped %lld row%s of %ss after the checkpoint's %s %lld\n", path, (long long)dropped,
                     dropped == 1 ? "" : "s", unit, unit, (long long)epoch);
done:
    if (fd >= 0) close(fd);
    if (tmp) unlink(tmp);
    free(out);
    return st;
}

/* The grad scaler's metadata keys in a checkpoint (f16 runs). */
#define GS_SCALE_KEY "ember.grad_scaler.scale"
#define GS_TRACKER_KEY "ember.grad_scaler.growth_tracker"

/* Saves the epoch checkpoint: cfg's metadata plus, with a scaler, its state. */
static em_status save_checkpoint(const char *path, const em_module *model, const em_optim *opt, const em_lr_scheduler *sched,
                                 const em_checkpoint_info *info, const em_learner_config *cfg, const em_grad_scaler *scaler)
{
    if (!scaler) return em_checkpoint_save(path, model, opt, sched, info, cfg->meta, cfg->n_meta);
    em_st_kv *kv = malloc(sizeof *kv * (cfg->n_meta + 2));
    if (!kv) return em__set_error(EM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < cfg->n_meta; i++) kv[i] = cfg->meta[i];
    em_grad_scaler_state gs;
    em_grad_scaler_get_state(scaler, &gs);
    char scale[48], tracker[32];
    snprintf(scale, sizeof scale, "%.17g", gs.scale);
    snprintf(tracker, sizeof tracker, "%lld", (long long)gs.growth_tracker);
    kv[cfg->n_meta] = (em_st_kv){.key = GS_SCALE_KEY, .value = scale};
    kv[cfg->n_meta + 1] = (em_st_kv){.key = GS_TRACKER_KEY, .value = tracker};
    em_status st = em_checkpoint_save(path, model, opt, sched, info, kv, cfg->n_meta + 2);
    free(kv);
    return st;
}

/* Restores the scaler's state from the checkpoint @p path when it holds one
 * (a checkpoint of a run without f16 does not: the scaler stays fresh). */
static em_status load_scaler_state(const char *path, em_grad_scaler *scaler)
{
    em_st_file *f = em_safetensors_open(path);
    if (!f) return em_last_status();
    const char *vs = em_safetensors_metadata(f, GS_SCALE_KEY), *vt = em_safetensors_metadata(f, GS_TRACKER_KEY);
    em_status st = EM_OK;
    if (vs || vt) {
        char *e1 = NULL, *e2 = NULL;
        em_grad_scaler_state gs = {.scale = vs ? strtod(vs, &e1) : NAN, .growth_tracker = vt ? strtoll(vt, &e2, 10) : -1};
        if (!vs || !vt || *e1 || *e2 || e1 == vs || e2 == vt || em_grad_scaler_set_state(scaler, &gs) != EM_OK)
            st = em__set_error(EM_ERR_FORMAT, "%s: bad grad-scaler state in the metadata (%s = '%s', %s = '%s')", path, GS_SCALE_KEY,
                               vs ? vs : "(missing)", GS_TRACKER_KEY, vt ? vt : "(missing)");
    }
    em_safetensors_close(f);
    return st;
}

static em_status fit(em_module *model, em_optim *opt, em_lr_scheduler *sched, em_loader *train, em_loader *val,
                     const em_learner_config *cfg_in, em_epoch_metrics *history, int max_history, int *n_history,
                     em_grad_scaler *scaler);
static em_status fit_iters(em_module *model, em_optim *opt, em_lr_scheduler *sched, const em_learner_config *cfg_in,
                           em_epoch_metrics *history, int max_history, int *n_history, em_grad_scaler *scaler);

em_status em_learner_fit(em_module *model, em_optim *opt, em_lr_scheduler *sched, em_loader *train, em_loader *val,
                         const em_learner_config *cfg_in, em_epoch_metrics *history, int max_history, int *n_history)
{
    const em_learner_config cfg = cfg_in ? *cfg_in : em_learner_config_default();
    const bool iters = cfg.max_iters > 0;
    if (!model || !opt || (!train && !iters))
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: %s is NULL", !model ? "model" : !opt ? "optimizer" : "train loader");
    if (cfg.max_iters < 0 || cfg.eval_interval < 0 || cfg.eval_iters < 0 || cfg.stop_after_iter < 0)
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: negative %s (%lld)",
                             cfg.max_iters < 0 ? "max_iters" : cfg.eval_interval < 0 ? "eval_interval" : cfg.eval_iters < 0 ? "eval_iters"
                                                                                                               : "stop_after_iter",
                             (long long)(cfg.max_iters < 0 ? cfg.max_iters : cfg.eval_interval < 0 ? cfg.eval_interval
                                         : cfg.eval_iters < 0 ? cfg.eval_iters : cfg.stop_after_iter));
    if (iters && !cfg.batch_source)
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: iteration mode (max_iters %lld) needs a batch_source", (long long)cfg.max_iters);
    if (iters && ((cfg.replicas && em_replicas_count(cfg.replicas) > 1) || em_dist_world_size() > 1))
        return em__set_error(EM_ERR_UNSUPPORTED, "em_learner_fit: iteration mode (max_iters) with replicas or several ranks is not supported yet");
    if ((unsigned)cfg.precision >= EM_PRECISION_COUNT)
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: precision %d is not an em_precision", (int)cfg.precision);
    if (cfg.precision == EM_PRECISION_TF32) { /* f32 matmuls and convs on TF32 tensor cores for this fit, then as before */
        const em_matmul_precision before = em_get_float32_matmul_precision();
        em_set_float32_matmul_precision(EM_MATMUL_HIGH);
        em_status st = fit(model, opt, sched, train, val, &cfg, history, max_history, n_history, NULL);
        em_set_float32_matmul_precision(before); /* fit's last act is a host read: its kernels have run */
        return st;
    }
    if (cfg.precision != EM_PRECISION_F16) return fit(model, opt, sched, train, val, &cfg, history, max_history, n_history, NULL);
    if (cfg.replicas && em_replicas_count(cfg.replicas) > 1)
        return em__set_error(EM_ERR_UNSUPPORTED, "em_learner_fit: precision f16 (loss scaling) with replicas is not supported yet "
                             "(use bf16, which needs no scaler)");
    em_grad_scaler *scaler = em_grad_scaler_new(NULL);
    if (!scaler) return em_last_status();
    em_status st = cfg.resume ? load_scaler_state(cfg.resume, scaler) : EM_OK;
    if (st == EM_OK) st = fit(model, opt, sched, train, val, &cfg, history, max_history, n_history, scaler);
    em_grad_scaler_free(scaler);
    return st;
}

static em_status fit(em_module *model, em_optim *opt, em_lr_scheduler *sched, em_loader *train, em_loader *val,
                     const em_learner_config *cfg_in, em_epoch_metrics *history, int max_history, int *n_history,
                     em_grad_scaler *scaler)
{
    if (cfg_in->max_iters > 0) return fit_iters(model, opt, sched, cfg_in, history, max_history, n_history, scaler);
    em_learner_config cfg = *cfg_in;
    FILE *log = cfg.log ? cfg.log : stdout;
    bool bar = cfg.progress == 1 || (cfg.progress < 0 && isatty(fileno(log)));
    if (em_dist_rank() != 0) { /* [dist] only rank 0 prints and writes files */
        log = NULL;
        cfg.out_dir = NULL;
    }
    if (n_history) *n_history = 0;
    const int R = cfg.replicas ? em_replicas_count(cfg.replicas) : 1; /* [dist] */
    if (cfg.replicas && (em_replicas_model(cfg.replicas, 0) != model || em_replicas_optim(cfg.replicas, 0) != opt))
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: with replicas, model and optimizer must be replica 0's");
    if (R > EM_LEARNER_MAX_REPLICAS)
        return em__set_error(EM_ERR_INVALID, "em_learner_fit: %d replicas (at most %d)", R, EM_LEARNER_MAX_REPLICAS);
    em_checkpoint_info info = {.best_metric = cfg.monitor_loss ? INFINITY : -INFINITY};
    if (cfg.resume) {
        em_status st = em_checkpoint_load(cfg.resume, model, opt, sched, &info);
        if (st != EM_OK) return st;
        em_rng_set_state(info.rng_seed, info.rng_offset);
        if (cfg.replicas && em_replicas_broadcast(cfg.replicas) != EM_OK) return em_last_status(); /* [dist] */
        if (log) fprintf(log, "resumed from %s at epoch %lld (step %lld)\n", cfg.resume, (long long)info.epoch, (long long)info.step);
    }
    if (cfg.out_dir && ensure_dir(cfg.out_dir) != EM_OK) return em_last_status();
    /* a kill during a write leaves NAME.tmp.XXXXXX behind; with --resume, rows after the checkpoint's epoch go */
    if (cfg.out_dir && em_run_dir_remove_stale_tmp(cfg.out_dir, log) < 0) return em_last_status();
    if (cfg.out_dir && cfg.resume && trim_metrics(cfg.out_dir, info.epoch, log, "epoch") != EM_OK) return em_last_status();
    char last_ckpt[4096]; /* for the interruption message */
    snprintf(last_ckpt, sizeof last_ckpt, "%s", cfg.resume ? cfg.resume : "");
    int64_t last_ckpt_epoch = info.epoch;
    /* the lr of the step about to run comes from the schedule, also after a
     * resume: the checkpoint's lr is the one its own run would have used next,
     * which is wrong when the resumed run has another schedule (more --epochs
     * stretch a cosine, a new --lr or --scheduler) */
    if (sched) em_optim_set_lr(opt, em_lr_scheduler_get_lr(sched));
    /* the epoch lines: a table under one header, 91 columns for "epoch 10/10" (< 100 up to 999 epochs) */
    char ep[64];
    const int ew = snprintf(ep, sizeof ep, "epoch %lld/%lld", (long long)cfg.epochs, (long long)cfg.epochs);
    if (log && info.epoch < cfg.epochs) {
        fprintf(log, "%*s  %10s  %9s  %8s  %7s  %8s  %8s  %9s  %7s\n", ew, "", "train_loss", "train_acc", "val_loss", "val_acc",
                "val_top5", "lr", "samples/s", "time");
        fflush(log);
    }
    bool warned_diverged = false; /* the divergence warning is printed once */
    for (int64_t epoch = info.epoch + 1; epoch <= cfg.epochs; epoch++) {
        em_epoch_metrics m = {.epoch = epoch, .val_loss = NAN, .val_accuracy = NAN, .val_top5 = NAN, .tokens_per_s = NAN,
                              .elapsed_s = NAN};
        running r[EM_LEARNER_MAX_REPLICAS] = {{0}};
        double t0 = now_s();
        em_status st = run_epoch(model, opt, sched, train, &cfg, true, epoch, &info.step, r, NULL, 0, bar, log, scaler);
        double dummy, nsamples; /* [dist] metrics and throughput of all ranks and replicas */
        running_read_global(r, R, st == EM_OK, &m.train_loss, &m.train_accuracy, &dummy, &nsamples);
        em_sync();
        double t_train = now_s() - t0;
        m.samples_per_s = t_train > 0 ? nsamples / t_train : 0;
        running_free(r, R);
        if (st == EM_OK && val) {
            st = run_epoch(model, opt, sched, val, &cfg, false, epoch, &info.step, r, NULL, 0, bar, log, NULL);
            running_read_global(r, R, st == EM_OK, &m.val_loss, &m.val_accuracy, &m.val_top5, &dummy); /* [dist] */
            running_free(r, R);
        }
        if (st == EM_ERR_INTERRUPTED) {
            char why[512];
            snprintf(why, sizeof why, "%s", em_last_error());
            if (last_ckpt[0])
                return em__set_error(EM_ERR_INTERRUPTED, "%s; nothing of epoch %lld was saved, the last checkpoint is %s (epoch %lld)",
                                     why, (long long)epoch, last_ckpt, (long long)last_ckpt_epoch);
            return em__set_error(EM_ERR_INTERRUPTED, "%s; no checkpoint was written yet", why);
        }
        if (st != EM_OK) return st;
        /* the lr this epoch's steps ran at (per-step schedule: its last step's), read before the epoch step moves it */
        m.lr = sched && cfg.sched_per_step ? em_lr_scheduler_lr_at(sched, em_lr_scheduler_get_step(sched) - 1) : em_optim_get_lr(opt);
        if (sched && !cfg.sched_per_step) em_lr_scheduler_step(sched, opt);
        m.epoch_time_s = now_s() - t0;
        snprintf(ep, sizeof ep, "epoch %lld/%lld", (long long)epoch, (long long)cfg.epochs);
        if (log) fprintf(log, "%-*s  %10.4f  %9.4f  %8.4f  %7.4f  %8.4f  %8.3g  %9.0f  %6.2fs\n", ew, ep, m.train_loss,
                         m.train_accuracy, m.val_loss, m.val_accuracy, m.val_top5, m.lr, m.samples_per_s, m.epoch_time_s);
        if (log && !warned_diverged && (!isfinite(m.train_loss) || (val && !isfinite(m.val_loss)))) {
            /* once per run: the first epoch whose training (else validation) loss is nan or inf */
            const bool tr = !isfinite(m.train_loss);
            fprintf(log, "warning: the %s loss is %s in epoch %lld: the run has diverged (lower --lr?)\n",
                    tr ? "training" : "validation", isnan(tr ? m.train_loss : m.val_loss) ? "nan"
                    : (tr ? m.train_loss : m.val_loss) > 0 ? "inf" : "-inf", (long long)epoch);
            warned_diverged = true;
        }
        if (log) fflush(log);
        if (history && n_history && *n_history < max_history) history[(*n_history)++] = m;
        /* early stopping / best model */
        double metric = cfg.monitor_loss ? (val ? m.val_loss : m.train_loss) : (val ? m.val_accuracy : m.train_accuracy);
        bool better = cfg.monitor_loss ? metric < info.best_metric : metric > info.best_metric;
        if (better) {
            info.best_metric = metric;
            info.best_epoch = epoch;
            info.bad_epochs = 0;
        } else {
            info.bad_epochs++;
        }
        info.epoch = epoch;
        em_rng_get_state(&info.rng_seed, &info.rng_offset);
        if (cfg.out_dir) {
            /* best, then the checkpoint (the commit point: a run killed before it redoes this epoch and
             * writes the same best again), then the metrics row, so no row describes an unsaved epoch */
            char path[4096];
            if (better) {
                snprintf(path, sizeof path, "%s/best.safetensors", cfg.out_dir);
                if (em_checkpoint_save(path, model, NULL, NULL, &info, cfg.meta, cfg.n_meta) != EM_OK) return em_last_status();
            }
            snprintf(path, sizeof path, "%s/checkpoint.safetensors", cfg.out_dir);
            if (save_checkpoint(path, model, opt, sched, &info, &cfg, scaler) != EM_OK) return em_last_status();
            snprintf(last_ckpt, sizeof last_ckpt, "%s", path);
            last_ckpt_epoch = epoch;
            if (append_metrics(cfg.out_dir, &m) != EM_OK) return em_last_status();
        }
        if (cfg.on_epoch && em_dist_rank() == 0) cfg.on_epoch(&m, cfg.on_epoch_ctx);
        if (cfg.stop_after_epoch > 0 && epoch >= cfg.stop_after_epoch) {
            if (log) fprintf(log, "stopping after epoch %lld as asked (resume with --resume)\n", (long long)epoch);
            break;
        }
        if (cfg.early_stopping_patience > 0 && info.bad_epochs >= cfg.early_stopping_patience) {
            if (log) fprintf(log, "early stopping: no improvement for %lld epochs (best %.4f at epoch %lld)\n",
                    (long long)info.bad_epochs, info.best_metric, (long long)info.best_epoch);
            break;
        }
    }
    return EM_OK;
}


/* ---- iteration mode (cfg.max_iters > 0) ---------------------------------------------- */

/* Cross-entropy of logits [N, C] against y [N], or of logits [..., C] of rank > 2 against y of the
 * leading shape, both flattened ([B, T, V] -> [B*T, V], [B, T] -> [B*T]). */
static em_tensor *lm_loss(em_tensor *logits, em_tensor *y, const em_cross_entropy_opts *o)
{
    const int nd = em_tensor_ndim(logits);
    if (nd <= 2) return em_cross_entropy(logits, y, o);
    const int64_t C = em_tensor_dim(logits, -1), N = C > 0 ? em_tensor_numel(logits) / C : 0;
    if (em_tensor_numel(y) != N) {
        char sl[160], sy[160];
        return em__fail(EM_ERR_SHAPE, "em_learner_fit: targets %s do not match logits %s (expected the logits' leading dims)",
                        em_shape_str(em_tensor_shape(y), em_tensor_ndim(y), sy, sizeof sy),
                        em_shape_str(em_tensor_shape(logits), nd, sl, sizeof sl));
    }
    const int64_t s2[2] = {N, C}, s1[1] = {N};
    return em_cross_entropy(em_reshape(logits, s2, 2), em_reshape(y, s1, 1), o);
}

/* Device-side sum of batch-mean losses, read only at evaluations. */
typedef struct iter_sum {
    em_tensor *sum; /* f32 0-d, owned */
    int64_t n;      /* batches summed */
} iter_sum;

static void iter_sum_add(iter_sum *r, em_tensor *loss) /* inside the step's scope */
{
    em_tensor *l = em_cast(em_detach(loss), EM_F32);
    em_tensor *nl = l ? em_tensor_retain(r->sum ? em_add(r->sum, l) : l) : NULL;
    em_tensor_release(r->sum);
    r->sum = nl;
    r->n++;
}

/* The mean (a host read: waits), NAN when empty or unreadable. */
static double iter_sum_mean(const iter_sum *r)
{
    double v;
    if (!r->n || !r->sum || em_item(r->sum, &v) != EM_OK) return NAN;
    return v / (double)r->n;
}

static void iter_sum_clear(iter_sum *r)
{
    em_tensor_release(r->sum);
    r->sum = NULL;
    r->n = 0;
}

/* One batch: forward and loss (autocast per cfg->precision); train: backward, clipping (no host
 * read), the optimizer step. Adds the loss to @p r and y's element count to @p ntargets. */
static em_status iter_step(em_module *model, em_optim *opt, const em_learner_config *cfg, bool train, int64_t iter, int64_t k,
                           em_tensor *const *params, int np, em_grad_scaler *scaler, iter_sum *r, int64_t *ntargets)
{
    em_status st;
    em_scope_begin();
    em_tensor *x = NULL, *y = NULL;
    const em_batch_split split = train ? EM_BATCH_TRAIN : EM_BATCH_VAL;
    st = cfg->batch_source(split, iter, k, &x, &y, cfg->batch_source_ctx);
    if (st == EM_OK && (!x || !y))
        st = em__set_error(EM_ERR_INVALID, "em_learner_fit: the batch source returned no %s for %s batch %lld of iteration %lld",
                           !x ? "inputs" : "targets", train ? "training" : "validation", (long long)k, (long long)iter);
    else if (st != EM_OK && em_last_status() == EM_OK)
        st = em__set_error(st, "em_learner_fit: the batch source failed (%s batch %lld of iteration %lld)",
                           train ? "training" : "validation", (long long)k, (long long)iter);
    if (st == EM_OK) *ntargets += em_tensor_numel(y);
    const em_dtype ac = precision_autocast(cfg->precision);
    bool opened = false;
    if (st == EM_OK && ac != EM_F32) opened = (st = em_autocast_begin(ac)) == EM_OK;
    em_tensor *logits = st == EM_OK ? em_module_forward(model, x) : NULL;
    em_tensor *loss = logits ? lm_loss(logits, y, &cfg->loss) : NULL;
    if (opened) em_autocast_end();
    if (st == EM_OK && !loss) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
    if (st == EM_OK && train) {
        em_tensor *l = scaler ? em_grad_scaler_scale(scaler, loss) : loss; /* f16: backward of loss * scale */
        em_grads *g = l ? em_backward(l) : NULL;
        if (!g) st = em_last_status() ? em_last_status() : EM_ERR_RUNTIME;
        /* f16: unscale before clipping (PyTorch's recipe) */
        if (st == EM_OK && scaler && cfg->clip_grad_norm > 0) st = em_grad_scaler_unscale(scaler, opt, g);
        if (st == EM_OK && cfg->clip_grad_norm > 0 && !em_clip_grad_norm_tensor(g, params, np, cfg->clip_grad_norm, 2.0))
            st = em_last_status();
        if (st == EM_OK && scaler) {
            st = em_grad_scaler_step(scaler, opt, g, NULL); /* one host read: a step with inf/NaN gradients is skipped */
            if (st == EM_OK) st = em_grad_scaler_update(scaler);
        } else if (st == EM_OK) {
            st = em_optim_step(opt, g);
        }
        em_grads_free(g);
    }
    if (st == EM_OK) iter_sum_add(r, loss);
    em_scope_end();
    return st;
}

/* "1,234,567" (NAN or negative: "-"). */
static const char *grouped(double v, char *buf, size_t n)
{
    if (!(v >= 0) || v > 9e18) {
        snprintf(buf, n, "-");
        return buf;
    }
    char raw[32];
    int len = snprintf(raw, sizeof raw, "%.0f", v), o = 0;
    for (int i = 0; i < len && o + 2 < (int)n; i++) {
        if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = 0;
    return buf;
}

static em_status append_iter_metrics(const char *dir, const em_epoch_metrics *m)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    struct stat sb;
    bool fresh = stat(path, &sb) != 0 || sb.st_size == 0;
    FILE *f = fopen(path, "a");
    if (!f) return em__set_error(EM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fresh) fprintf(f, "iter,train_loss,val_loss,lr,tokens_per_s,elapsed_s\n");
    fprintf(f, "%lld,%.6f,%.6f,%.8g,%.1f,%.3f\n", (long long)m->iter, m->train_loss, m->val_loss, m->lr, m->tokens_per_s,
            m->elapsed_s);
    return fclose(f) == 0 ? EM_OK : em__set_error(EM_ERR_IO, "cannot write %s", path);
}

static em_status fit_iters(em_module *model, em_optim *opt, em_lr_scheduler *sched, const em_learner_config *cfg_in,
                           em_epoch_metrics *history, int max_history, int *n_history, em_grad_scaler *scaler)
{
    em_learner_config cfg = *cfg_in;
    FILE *log = cfg.log ? cfg.log : stdout;
    const bool bar = cfg.progress == 1 || (cfg.progress < 0 && isatty(fileno(log)));
    if (n_history) *n_history = 0;
    em_checkpoint_info info = {.best_metric = INFINITY};
    if (cfg.resume) {
        em_status st = em_checkpoint_load(cfg.resume, model, opt, sched, &info);
        if (st != EM_OK) return st;
        if (info.step > cfg.max_iters)
            return em__set_error(EM_ERR_INVALID, "%s: the checkpoint has done %lld iterations, more than max_iters %lld", cfg.resume,
                                 (long long)info.step, (long long)cfg.max_iters);
        em_rng_set_state(info.rng_seed, info.rng_offset);
        if (log) fprintf(log, "resumed from %s at iteration %lld\n", cfg.resume, (long long)info.step);
    }
    if (cfg.out_dir && ensure_dir(cfg.out_dir) != EM_OK) return em_last_status();
    if (cfg.out_dir && em_run_dir_remove_stale_tmp(cfg.out_dir, log) < 0) return em_last_status();
    if (cfg.out_dir && cfg.resume && trim_metrics(cfg.out_dir, info.step, log, "iteration") != EM_OK) return em_last_status();
    char last_ckpt[4096];
    snprintf(last_ckpt, sizeof last_ckpt, "%s", cfg.resume ? cfg.resume : "");
    int64_t last_ckpt_iter = info.step;
    const int np = em_module_num_param_tensors(model);
    em_tensor **params = malloc(sizeof *params * (size_t)(np > 0 ? np : 1));
    if (!params) return em__set_error(EM_ERR_NOMEM, "out of memory");
    em_module_parameters(model, params, np);
    if (sched) em_optim_set_lr(opt, em_lr_scheduler_get_lr(sched)); /* iteration i runs at lr_at(i), also after a resume */
    char it_s[64];
    const int iw = snprintf(it_s, sizeof it_s, "iter %lld/%lld", (long long)cfg.max_iters, (long long)cfg.max_iters);
    if (log && (info.step < cfg.max_iters || !cfg.resume)) {
        fprintf(log, "%*s  %10s  %8s  %8s  %10s  %9s\n", iw, "", "train_loss", "val_loss", "lr", "tokens/s", "elapsed");
        fflush(log);
    }
    const int64_t interval = cfg.eval_interval > 0 ? cfg.eval_interval : cfg.max_iters;
    const int64_t report_every = interval / 20 > 0 ? interval / 20 : 1;
    const bool can_stop = cfg.stop_flag != NULL;
    em_module_train(model, true);
    iter_sum tr = {0};
    int64_t it = info.step, ntok = 0, done = 0;
    bool need_eval = !cfg.resume, warned = false;
    em_status st = EM_OK;
    const double t_start = now_s();
    double t_int = t_start;
    for (;;) {
        if (need_eval) {
            need_eval = false;
            em_epoch_metrics m = {.iter = it, .train_accuracy = NAN, .val_loss = NAN, .val_accuracy = NAN, .val_top5 = NAN};
            m.train_loss = iter_sum_mean(&tr); /* a host read: the interval's steps have run */
            em_sync();
            const double t_train = now_s() - t_int;
            m.tokens_per_s = tr.n > 0 && t_train > 0 ? (double)ntok / t_train : NAN;
            m.samples_per_s = NAN;
            iter_sum_clear(&tr);
            if (cfg.eval_iters > 0) {
                iter_sum va = {0};
                int64_t vtok = 0;
                const int64_t vreport = cfg.eval_iters / 10 > 0 ? cfg.eval_iters / 10 : 1;
                const double tv = now_s();
                em_module_train(model, false);
                em_no_grad_begin();
                for (int64_t k = 0; k < cfg.eval_iters && st == EM_OK; k++) {
                    if (can_stop && *cfg.stop_flag) {
                        st = em__set_error(EM_ERR_INTERRUPTED, "interrupted at iteration %lld (validation, after %lld of %lld batches)",
                                           (long long)it, (long long)k, (long long)cfg.eval_iters);
                        break;
                    }
                    st = iter_step(model, opt, &cfg, false, it, k, params, np, NULL, &va, &vtok);
                    if (st == EM_OK && log && bar && ((k + 1) % vreport == 0 || k + 1 == cfg.eval_iters))
                        progress(log, "valid", it, cfg.max_iters, k + 1, cfg.eval_iters, now_s() - tv, iter_sum_mean(&va));
                }
                em_no_grad_end();
                em_module_train(model, true);
                if (bar && log) progress_clear(log);
                if (st == EM_OK) m.val_loss = iter_sum_mean(&va);
                iter_sum_clear(&va);
            }
            if (st != EM_OK) break;
            m.lr = sched ? em_lr_scheduler_lr_at(sched, it > 0 ? it - 1 : 0) : em_optim_get_lr(opt);
            m.elapsed_s = now_s() - t_start;
            m.epoch_time_s = now_s() - t_int;
            snprintf(it_s, sizeof it_s, "iter %lld/%lld", (long long)it, (long long)cfg.max_iters);
            char tl[32], vl[32], tk[32];
            if (isnan(m.train_loss)) snprintf(tl, sizeof tl, "-");
            else snprintf(tl, sizeof tl, "%.4f", m.train_loss);
            if (isnan(m.val_loss) && cfg.eval_iters == 0) snprintf(vl, sizeof vl, "-");
            else snprintf(vl, sizeof vl, "%.4f", m.val_loss);
            if (log) fprintf(log, "%-*s  %10s  %8s  %8.2e  %10s  %8.1fs\n", iw, it_s, tl, vl, m.lr, grouped(m.tokens_per_s, tk, sizeof tk),
                             m.elapsed_s);
            const double metric = cfg.eval_iters > 0 ? m.val_loss : m.train_loss;
            if (log && !warned && it > 0 && (!isfinite(m.train_loss) || (cfg.eval_iters > 0 && !isfinite(m.val_loss)))) {
                fprintf(log, "warning: the %s loss is not finite at iteration %lld: the run has diverged (lower --lr?)\n",
                        !isfinite(m.train_loss) ? "training" : "validation", (long long)it);
                warned = true;
            }
            if (log) fflush(log);
            if (history && n_history && *n_history < max_history) history[(*n_history)++] = m;
            const bool better = metric < info.best_metric;
            if (better) {
                info.best_metric = metric;
                info.best_epoch = it;
                info.bad_epochs = 0;
            } else if (!(it == 0 && isnan(metric))) { /* a NaN counts as no improvement, except train loss at 0 */
                info.bad_epochs++;
            }
            info.step = it;
            em_rng_get_state(&info.rng_seed, &info.rng_offset);
            if (cfg.out_dir) { /* best, then the checkpoint (the commit point), then the metrics row */
                char path[4096];
                if (better) {
                    snprintf(path, sizeof path, "%s/best.safetensors", cfg.out_dir);
                    if ((st = em_checkpoint_save(path, model, NULL, NULL, &info, cfg.meta, cfg.n_meta)) != EM_OK) break;
                }
                snprintf(path, sizeof path, "%s/checkpoint.safetensors", cfg.out_dir);
                if ((st = save_checkpoint(path, model, opt, sched, &info, &cfg, scaler)) != EM_OK) break;
                snprintf(last_ckpt, sizeof last_ckpt, "%s", path);
                last_ckpt_iter = it;
                if ((st = append_iter_metrics(cfg.out_dir, &m)) != EM_OK) break;
            }
            if (cfg.on_epoch) cfg.on_epoch(&m, cfg.on_epoch_ctx);
            if (it >= cfg.max_iters) break;
            if (cfg.stop_after_iter > 0 && it >= cfg.stop_after_iter) {
                if (log) fprintf(log, "stopping after iteration %lld as asked (resume with --resume)\n", (long long)it);
                break;
            }
            if (cfg.early_stopping_patience > 0 && info.bad_epochs >= cfg.early_stopping_patience) {
                if (log) fprintf(log, "early stopping: no improvement for %lld evaluations (best %.4f at iteration %lld)\n",
                                 (long long)info.bad_epochs, info.best_metric, (long long)info.best_epoch);
                break;
            }
            ntok = done = 0;
            t_int = now_s();
        }
        if (it >= cfg.max_iters) break;
        if (can_stop && *cfg.stop_flag) {
            st = em__set_error(EM_ERR_INTERRUPTED, "interrupted at iteration %lld", (long long)it);
            break;
        }
        st = iter_step(model, opt, &cfg, true, it, 0, params, np, scaler, &tr, &ntok);
        if (st != EM_OK) break;
        it++;
        done++;
        if (sched) em_lr_scheduler_step(sched, opt);
        need_eval = it % interval == 0 || it == cfg.max_iters || (cfg.stop_after_iter > 0 && it == cfg.stop_after_iter);
        if (log && bar && !need_eval && (done == 1 || done % report_every == 0)) { /* each redraw reads the loss: a sync */
            progress(log, "train", it, cfg.max_iters, it % interval, interval, now_s() - t_int, iter_sum_mean(&tr));
        }
    }
    if (bar && log) progress_clear(log);
    iter_sum_clear(&tr);
    free(params);
    if (st == EM_ERR_INTERRUPTED) {
        char why[512];
        snprintf(why, sizeof why, "%s", em_last_error());
        if (last_ckpt[0])
            return em__set_error(EM_ERR_INTERRUPTED, "%s; the iterations since the last evaluation were not saved, the last "
                                 "checkpoint is %s (iteration %lld)", why, last_ckpt, (long long)last_ckpt_iter);
        return em__set_error(EM_ERR_INTERRUPTED, "%s; no checkpoint was written yet", why);
    }
    return st;
}

em_status em_evaluate(em_module *model, em_loader *data, int64_t num_classes, em_eval_result *out, int64_t *confusion)
{
    if (!model || !data || !out) return em__set_error(EM_ERR_INVALID, "em_evaluate: NULL argument");
    em_learner_config cfg = em_learner_config_default();
    cfg.epochs = 1;
    running r[1] = {{0}};
    if (confusion) memset(confusion, 0, sizeof *confusion * (size_t)(num_classes * num_classes));
    int64_t step = 0;
    em_status st = run_epoch(model, NULL, NULL, data, &cfg, false, 1, &step, r, confusion, num_classes, false, NULL, NULL);
    if (st == EM_OK) running_read(r, 1, &out->loss, &out->accuracy, &out->top5);
    out->samples = r[0].samples;
    running_free(r, 1);
    return st;
}
