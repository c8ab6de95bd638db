/* Served models: loading, the dynamic batcher and the model instances of
 * `ember serve` (DESIGN.md §9).
 *
 * Each (model, version) has one bounded queue of requests (ems_job), one
 * batcher thread and its instances, each a thread with its own copy of the
 * module on one device (the CPU workers, or one GPU: em_set_thread_device,
 * so StarPU runs the instance's tasks there). A checkpoint's module is built
 * by the loader; an ONNX model (model.onnx) is em_onnx_load'ed by each
 * instance on its own thread and device, checked by the first
 * (onnx_describe), run with em_onnx_run and em_onnx_free'd by that thread;
 * from the batch's forward on it is the classifier path (softmax, outputs).
 *
 * The batcher, as Triton's dynamic batcher (docs/user_guide/model_configuration.md,
 * "Dynamic Batcher"): requests of the same per-sample shape are merged, in
 * arrival order, into a batch of at most max_batch_size rows. A batch goes
 * when it is full, when the next request does not fit, when its rows reach
 * a preferred size, or when its oldest request has waited
 * max_queue_delay_microseconds; otherwise the batcher waits (a batch
 * forms only while an instance can take it, so requests that arrive while
 * every instance is busy join the next batch).
 *
 * Placement (mixed CPU/GPU): a batch of R rows goes to the instance
 * predicted to finish it first, max(0, busy_until - now) + est(R), where
 * est is the instance's own measured time for batches of that size (an
 * exponential moving average per power-of-two size bucket, seeded by a
 * warm-up forward at load). When the winner is busy the batch waits for it
 * rather than going to a slower idle instance. An idle instance whose
 * estimate has not been refreshed for EMS_REMEASURE_S seconds takes the next
 * batch (exploration: a first estimate that was too high is corrected). This is the measured
 * equivalent of StarPU's dmda (deque model data aware: expected end time),
 * one level up: an instance's batch is a whole forward of many tasks.
 */
#define _GNU_SOURCE
#include "serve/serve_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* ---- small helpers ------------------------------------------------------------ */

static void abs_time(double t_mono, struct timespec *ts)
{
    /* the condition variables run on CLOCK_MONOTONIC (pthread_condattr_setclock) */
    if (t_mono < 0) t_mono = 0;
    ts->tv_sec = (time_t)t_mono;
    ts->tv_nsec = (long)((t_mono - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static int bucket_of(int64_t rows)
{
    int b = 0;
    while (((int64_t)1 << b) < rows && b < EMS_HIST_BS + 7) b++;
    return b;
}

/* Predicted seconds for a batch of @p rows on @p in (0 when nothing is measured yet). */
static double estimate(const ems_instance *in, int64_t rows)
{
    int b = bucket_of(rows);
    if (in->est[b] > 0) return in->est[b];
    for (int d = 1; d < EMS_HIST_BS + 8; d++) {
        if (b - d >= 0 && in->est[b - d] > 0) return in->est[b - d] * (double)((int64_t)1 << d); /* linear in rows upwards */
        if (b + d < EMS_HIST_BS + 8 && in->est[b + d] > 0) return in->est[b + d];            /* no cheaper than a bigger batch's */
    }
    return 0;
}

/* A measured batch time; @p reset replaces the estimate (the warm-up's last
 * pass) instead of averaging it in. */
static void record_time(ems_instance *in, int64_t rows, double s, bool reset)
{
    int b = bucket_of(rows);
    in->est[b] = in->est[b] > 0 && !reset ? 0.8 * in->est[b] + 0.2 * s : s;
    in->est_t[b] = ems_now();
}

/* Whether @p in's estimate for @p rows is older than EMS_REMEASURE_S: an
 * instance that lost every placement for that long gets the next batch it
 * can take, so an estimate that was too high (a slow first batch, a busy
 * moment) is measured again instead of keeping the instance idle forever. */
static bool stale(const ems_instance *in, int64_t rows, double now)
{
    int b = bucket_of(rows);
    return in->est[b] > 0 && now - in->est_t[b] > EMS_REMEASURE_S;
}

static int parse_norm_list(const char *s, float *out, int max)
{
    int n = 0;
    if (!s) return 0;
    while (*s) {
        char *end;
        errno = 0;
        double v = strtod(s, &end);
        if (end == s || errno || n >= max || !(v == v)) return -1;
        out[n++] = (float)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static void job_finish(ems_job *j, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    j->http_status = status;
    if (msg) snprintf(j->err, sizeof j->err, "%s", msg);
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void hist_time(uint64_t *h, double s)
{
    static const double edges[EMS_HIST_T] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 1e-1, 1.0, 10.0};
    int i = 0;
    while (i < EMS_HIST_T && s > edges[i]) i++;
    h[i]++;
}

/* ---- one batch on one instance ------------------------------------------------------ */

/* Runs the forward of @p batch (a list of jobs) on the instance's device;
 * fills every job's outputs. 0, or -1 with the reason in @p err. */
static int run_batch(ems_instance *in, ems_job *batch, int64_t rows, char *err, size_t nerr)
{
    ems_model *m = in->model;
    const int64_t sample = batch->sample;
    bool probs = false;
    for (ems_job *j = batch; j; j = j->next) probs = probs || j->want_probs;
    int64_t K = m->out_cols; /* 0 before a classifier's first forward: its class count comes from that */
    float *logits = NULL, *p = NULL;
    void *x = malloc((size_t)(rows * sample) * (m->kind == EMS_KIND_GPT ? sizeof(int64_t) : sizeof(float)));
    int rc = -1;
    if (!x) {
        snprintf(err, nerr, "out of host memory for a batch of %lld rows", (long long)rows);
        goto out;
    }
    int64_t off = 0;
    for (ems_job *j = batch; j; j = j->next) {
        if (m->kind == EMS_KIND_GPT) memcpy((int64_t *)x + off, j->xi, (size_t)(j->rows * sample) * sizeof(int64_t));
        else memcpy((float *)x + off, j->xf, (size_t)(j->rows * sample) * sizeof(float));
        off += j->rows * sample;
    }
    int64_t shape[EMS_MAX_RANK + 1];
    int nd;
    shape[0] = rows;
    if (m->kind == EMS_KIND_GPT) {
        shape[1] = sample;
        nd = 2;
    } else {
        for (int i = 0; i < m->ndim; i++) shape[1 + i] = m->dims[i];
        nd = 1 + m->ndim;
    }
    em_scope_begin();
    em_no_grad_begin();
    em_tensor *xt = em_from_host(x, shape, nd, m->kind == EMS_KIND_GPT ? EM_I64 : EM_F32);
    em_tensor *y = NULL, *y_owned = NULL; /* em_onnx_run's output is the caller's, not the scope's */
    if (xt && in->onnx) {
        if (em_onnx_run(in->onnx, &xt, 1, &y_owned, 1) == EM_OK) y = y_owned;
    } else if (xt) {
        y = em_module_forward(in->module, xt);
    }
    if (y && em_tensor_dtype(y) != EM_F32) {
        snprintf(err, nerr, "the model's output is %s, not FP32 logits", em_dtype_name(em_tensor_dtype(y)));
        em_tensor_release(y_owned);
        em_no_grad_end();
        em_scope_end();
        goto out;
    }
    if (y && m->kind == EMS_KIND_GPT) y = em_contiguous(em_reshape(em_narrow(y, 1, sample - 1, 1), (int64_t[]){rows, K}, 2));
    bool ok = y != NULL;
    if (ok && K == 0 && em_tensor_ndim(y) == 2) K = m->out_cols = em_tensor_dim(y, 1);
    if (ok && (K < 1 || em_tensor_ndim(y) != 2 || em_tensor_dim(y, 0) != rows || em_tensor_dim(y, 1) != K)) {
        char b1[96];
        if (K > 0)
            snprintf(err, nerr, "the model's output has shape %s, not [%lld, %lld]",
                     em_shape_str(em_tensor_shape(y), em_tensor_ndim(y), b1, sizeof b1), (long long)rows, (long long)K);
        else
            snprintf(err, nerr, "the model's output has shape %s, not [%lld, classes] (rank 2 logits)",
                     em_shape_str(em_tensor_shape(y), em_tensor_ndim(y), b1, sizeof b1), (long long)rows);
        em_tensor_release(y_owned);
        em_no_grad_end();
        em_scope_end();
        goto out;
    }
    em_tensor *pt = ok && probs ? em_softmax(y, 1) : NULL;
    ok = ok && (!probs || pt);
    if (ok) {
        logits = malloc((size_t)(rows * K) * sizeof(float));
        p = probs ? malloc((size_t)(rows * K) * sizeof(float)) : NULL;
        if (!logits || (probs && !p)) {
            snprintf(err, nerr, "out of host memory for a batch of %lld rows", (long long)rows);
            em_tensor_release(y_owned);
            em_no_grad_end();
            em_scope_end();
            goto out;
        }
    }
    if (ok) ok = em_to_host(y, logits, (size_t)(rows * K) * sizeof(float)) == EM_OK;
    if (ok && probs) ok = em_to_host(pt, p, (size_t)(rows * K) * sizeof(float)) == EM_OK;
    if (!ok) snprintf(err, nerr, "forward on %s failed: %s", in->device_name, em_last_error());
    em_tensor_release(y_owned);
    em_no_grad_end();
    em_scope_end();
    if (!ok) goto out;
    off = 0;
    for (ems_job *j = batch; j; j = j->next) {
        j->out_cols = K;
        for (int o = 0; o < 2; o++) {
            if (o == 1 && !j->want_probs) continue;
            j->out[o] = malloc((size_t)(j->rows * K) * sizeof(float));
            if (!j->out[o]) {
                snprintf(err, nerr, "out of host memory for the outputs");
                goto out;
            }
            memcpy(j->out[o], (o ? p : logits) + off * K, (size_t)(j->rows * K) * sizeof(float));
        }
        off += j->rows;
    }
    rc = 0;
out:
    free(logits);
    free(p);
    free(x);
    return rc;
}

/* The warm-up batch of load: @p rows rows of zeros (GPT: token 0, T = 1). */
static int warmup(ems_instance *in, int64_t rows, char *err, size_t nerr)
{
    ems_model *m = in->model;
    ems_job j;
    memset(&j, 0, sizeof j);
    j.rows = rows;
    j.sample = m->kind == EMS_KIND_GPT ? 1 : m->sample;
    if (m->kind == EMS_KIND_GPT) j.xi = calloc((size_t)(rows * j.sample), sizeof(int64_t));
    else j.xf = calloc((size_t)(rows * j.sample), sizeof(float));
    j.want_probs = m->kind == EMS_KIND_CLASSIFIER;
    if (!j.xi && !j.xf) {
        snprintf(err, nerr, "out of host memory");
        return -1;
    }
    double t0 = ems_now();
    int rc = run_batch(in, &j, rows, err, nerr);
    if (rc == 0) record_time(in, rows, ems_now() - t0, true);
    free(j.xi);
    free(j.xf);
    free(j.out[0]);
    free(j.out[1]);
    return rc;
}

typedef struct {
    ems_instance *in;
    int status; /* 0 running, 1 ready, -1 failed */
    char err[512];
    pthread_mutex_t mu;
    pthread_cond_t cv;
} inst_start;

static const char *dims_str(const int64_t *d, int nd, int64_t lead, char *buf, size_t n);

/* Checks that the ONNX model @p om is one ember serve can serve as a
 * classifier and sets the model's request shape from it: exactly one graph
 * input, of dtype FLOAT, declared as [batch, d1, ...] with d1... static (dim
 * 0 symbolic: the batch); config.json's input dims, when given, equal to
 * d1...; the first output FLOAT (or undeclared). Sets m->dims / ndim /
 * sample / nchan and, unless config.json names the input, its name. 0, or
 * -1 with the reason in @p err. */
static int onnx_describe(ems_model *m, const em_onnx_model *om, char *err, size_t nerr)
{
    int nin = em_onnx_num_inputs(om);
    if (nin != 1) {
        char names[256] = "";
        size_t w = 0;
        for (int i = 0; i < nin && i < 4 && w < sizeof names; i++)
            w += (size_t)snprintf(names + w, sizeof names - w, "%s'%s'", i ? ", " : "", em_onnx_input_name(om, i));
        if (nin > 4 && w < sizeof names) snprintf(names + w, sizeof names - w, ", ...");
        snprintf(err, nerr, "%.300s: the ONNX model has %d inputs%s%s%s: ember serve serves models of exactly one input", m->path, nin,
                 nin ? " (" : "", names, nin ? ")" : "");
        return -1;
    }
    const char *iname = em_onnx_input_name(om, 0);
    em_dtype dt = em_onnx_input_dtype(om, 0);
    if (dt != EM_F32) {
        snprintf(err, nerr, "%.300s: the ONNX model's input '%s' is %s: ember serve serves ONNX models of one FLOAT input", m->path, iname,
                 em_dtype_name(dt));
        return -1;
    }
    int64_t shape[EM_MAX_DIMS];
    int r = em_onnx_input_shape(om, 0, shape);
    char b1[160], b2[160];
    if (r < 2 || r > EMS_MAX_RANK) { /* a request's rank, batch included, is at most EMS_MAX_RANK */
        if (r < 0) snprintf(err, nerr, "%.300s: the ONNX model's input '%s' declares no shape: ember serve needs [batch, dims...]", m->path, iname);
        else snprintf(err, nerr, "%.300s: the ONNX model's input '%s' has rank %d: ember serve needs [batch, dims...] of rank 2 to %d", m->path,
                      iname, r, EMS_MAX_RANK);
        return -1;
    }
    bool dyn = false;
    for (int i = 1; i < r; i++) dyn = dyn || shape[i] < 1;
    if (shape[0] >= 0 || dyn) {
        /* shape[0] as the model declares it: -1 prints as the batch */
        snprintf(err, nerr, "%.300s: the ONNX model's input '%s' has shape %s: ember serve needs dim 0 symbolic (the batch) and the others static",
                 m->path, iname, dims_str(shape + 1, r - 1, shape[0], b1, sizeof b1));
        return -1;
    }
    if (m->cfg.input_ndim > 0) {
        bool same = m->cfg.input_ndim == r - 1;
        for (int i = 0; same && i < r - 1; i++) same = m->cfg.input_dims[i] == shape[1 + i];
        if (!same) {
            snprintf(err, nerr, "config.json input dims %s do not fit the ONNX model's input '%s' %s (give the dims after the batch as the model declares them)",
                     dims_str(m->cfg.input_dims, m->cfg.input_ndim, -1, b1, sizeof b1), iname, dims_str(shape + 1, r - 1, -1, b2, sizeof b2));
            return -1;
        }
    }
    int ot = em_onnx_num_outputs(om) > 0 ? em_onnx_output_type(om, 0) : -1;
    if (ot != 1 && ot != 0) {
        if (ot < 0) snprintf(err, nerr, "%.300s: the ONNX model has no output", m->path);
        else snprintf(err, nerr, "%.300s: the ONNX model's first output '%s' is %s: ember serve serves it as FLOAT logits", m->path,
                      em_onnx_output_name(om, 0), em_onnx_type_name(ot));
        return -1;
    }
    if (!m->cfg.input_name[0]) {
        if (strlen(iname) >= sizeof m->cfg.input_name) {
            snprintf(err, nerr, "%.300s: the ONNX model's input name '%.40s...' is longer than %zu bytes: name it in config.json's \"input\"",
                     m->path, iname, sizeof m->cfg.input_name - 1);
            return -1;
        }
        snprintf(m->cfg.input_name, sizeof m->cfg.input_name, "%s", iname);
    }
    m->ndim = r - 1;
    m->sample = 1;
    for (int i = 0; i < m->ndim; i++) {
        m->dims[i] = shape[1 + i];
        m->sample *= shape[1 + i];
    }
    m->nchan = m->ndim == 3 ? (int)m->dims[0] : 1; /* as a CNN's [C, H, W] */
    return 0;
}

static void *instance_main(void *arg)
{
    inst_start *st = arg;
    ems_instance *in = st->in;
    ems_model *m = in->model;
    char err[512] = "";
    int rc = 0;
    if (em_set_thread_device(in->device) != EM_OK) {
        snprintf(err, sizeof err, "instance on %s: %s", in->device_name, em_last_error());
        rc = -1;
    }
    /* an ONNX model: this instance's own copy, loaded on its device; the
     * first instance also checks it and sets the request shape (the loader
     * starts the instances one after the other) */
    if (rc == 0 && m->onnx) {
        const char *e = NULL;
        in->onnx = em_onnx_load(m->path, &e);
        if (!in->onnx) {
            snprintf(err, sizeof err, "%s", e ? e : em_last_error());
            rc = -1;
        } else if (in->index == 0 && onnx_describe(m, in->onnx, err, sizeof err) != 0) {
            rc = -1;
        }
    }
    /* warm-up forwards of one row (a classifier's also of a full batch), each
     * size EMS_WARMUP times: the first pays for the device's start (CUDA
     * context, cuBLAS handles, caches), the last one's time is the estimate */
    for (int k = 0; k < EMS_WARMUP && rc == 0; k++) {
        if (warmup(in, 1, err, sizeof err) != 0) rc = -1;
        if (rc == 0 && m->kind == EMS_KIND_CLASSIFIER && m->cfg.max_batch_size > 1 &&
            warmup(in, m->cfg.max_batch_size < EMS_WARMUP_ROWS ? m->cfg.max_batch_size : EMS_WARMUP_ROWS, err, sizeof err) != 0)
            rc = -1;
    }
    pthread_mutex_lock(&st->mu);
    st->status = rc == 0 ? 1 : -1;
    snprintf(st->err, sizeof st->err, "%s", err);
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    if (rc != 0) { /* st belongs to the loader from here */
        em_onnx_free(in->onnx);
        in->onnx = NULL;
        em_clear_thread_device();
        em_thread_exit();
        return NULL;
    }

    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!in->batch && !m->stopping) pthread_cond_wait(&in->cv, &m->mu);
        if (!in->batch) {
            /* stopping: the batcher hands out what is queued before it ends; leave when it is gone */
            if (!m->batcher_started) break;
            pthread_cond_wait(&in->cv, &m->mu);
            continue;
        }
        ems_job *batch = in->batch;
        int64_t rows = in->batch_rows;
        pthread_mutex_unlock(&m->mu);
        double t0 = ems_now();
        char e2[512] = "";
        int r = run_batch(in, batch, rows, e2, sizeof e2);
        double dt = ems_now() - t0;
        pthread_mutex_lock(&m->mu);
        in->batch = NULL;
        in->batch_rows = 0;
        if (r == 0) record_time(in, rows, dt, false);
        in->batches++;
        in->rows_done += (uint64_t)rows;
        m->n_batches++;
        int b = bucket_of(rows);
        m->hist_bs[b < EMS_HIST_BS ? b : EMS_HIST_BS]++;
        m->sum_bs += (double)rows;
        for (ems_job *j = batch; j; j = j->next) {
            j->compute_s = dt;
            if (r == 0) {
                m->n_success++;
                hist_time(m->hist_c, dt);
                m->sum_c += dt;
            } else {
                m->n_error++;
            }
        }
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
        for (ems_job *j = batch, *nx; j; j = nx) {
            nx = j->next;
            j->next = NULL;
            job_finish(j, r == 0 ? 200 : 500, r == 0 ? NULL : e2);
        }
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    em_onnx_free(in->onnx);
    in->onnx = NULL;
    em_clear_thread_device();
    em_thread_exit();
    return NULL;
}

/* ---- the batcher --------------------------------------------------------------------- */

static bool is_preferred(const ems_model *m, int64_t rows)
{
    for (int i = 0; i < m->cfg.npreferred; i++)
        if (m->cfg.preferred[i] == rows) return true;
    return false;
}

/* Removes the jobs whose deadline has passed (answered 504 as Triton's
 * "Request timeout expired"); returns the earliest remaining deadline (0: none). */
static double expire(ems_model *m, double now)
{
    double next = 0;
    ems_job **pp = &m->head, *last = NULL;
    while (*pp) {
        ems_job *j = *pp;
        if (j->t_deadline > 0 && now >= j->t_deadline) {
            *pp = j->next;
            j->next = NULL;
            m->queued--;
            m->n_timeout++;
            j->queue_s = now - j->t_enqueue;
            job_finish(j, 504, "request timeout expired: the request waited in the queue past its deadline");
            continue;
        }
        if (j->t_deadline > 0 && (next == 0 || j->t_deadline < next)) next = j->t_deadline;
        last = j;
        pp = &j->next;
    }
    m->tail = last;
    return next;
}

static void *batcher_main(void *arg)
{
    ems_model *m = arg;
    const ems_model_config *c = &m->cfg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        if (!m->head) {
            if (m->stopping) break;
            pthread_cond_wait(&m->cv, &m->mu);
            continue;
        }
        double now = ems_now();
        double next_deadline = expire(m, now);
        if (!m->head) continue;
        /* the candidate batch: a prefix of the queue with one per-sample shape */
        int64_t total = 0, cut_rows = 0;
        int n = 0, cut_n = 0;
        bool blocked = false;
        for (ems_job *j = m->head; j; j = j->next) {
            if (j->sample != m->head->sample || total + j->rows > c->max_batch_size) {
                blocked = true;
                break;
            }
            total += j->rows;
            n++;
            if (is_preferred(m, total)) {
                cut_rows = total;
                cut_n = n;
            }
        }
        double due = m->head->t_enqueue + 1e-6 * (double)c->max_queue_delay_us;
        bool expired = now >= due || m->stopping || m->flush;
        if (total >= c->max_batch_size || blocked || expired) {
            cut_rows = total;
            cut_n = n;
        } else if (cut_n == 0) { /* wait for more requests, the delay or a deadline */
            double until = due;
            if (next_deadline > 0 && next_deadline < until) until = next_deadline;
            struct timespec ts;
            abs_time(until, &ts);
            pthread_cond_timedwait(&m->cv, &m->mu, &ts);
            continue;
        }
        /* the instance predicted to finish this batch first */
        int best = -1;
        double best_t = 0;
        bool best_idle = false;
        for (int i = 0; i < m->ninstances; i++) {
            ems_instance *in = &m->inst[i];
            bool idle = in->batch == NULL;
            double wait = idle ? 0 : fmax(0.0, in->busy_until - now);
            double t = idle && stale(in, cut_rows, now) ? 0 : wait + estimate(in, cut_rows);
            if (best < 0 || t < best_t || (t == best_t && idle && !best_idle)) {
                best = i;
                best_t = t;
                best_idle = idle;
            }
        }
        ems_instance *in = &m->inst[best];
        if (in->batch) { /* the fastest is busy: wait for it (or any change), then decide again */
            double until = fmax(in->busy_until, now + 50e-6);
            if (until > now + 0.01) until = now + 0.01;
            if (next_deadline > 0 && next_deadline < until) until = next_deadline;
            struct timespec ts;
            abs_time(until, &ts);
            pthread_cond_timedwait(&m->cv, &m->mu, &ts);
            continue;
        }
        ems_job *first = m->head, *j = first;
        for (int k = 1; k < cut_n; k++) j = j->next;
        m->head = j->next;
        if (!m->head) m->tail = NULL;
        j->next = NULL;
        m->queued -= cut_n;
        for (ems_job *q = first; q; q = q->next) {
            q->queue_s = now - q->t_enqueue;
            hist_time(m->hist_q, q->queue_s);
            m->sum_q += q->queue_s;
            m->n_q++;
        }
        in->batch = first;
        in->batch_rows = cut_rows;
        in->busy_until = now + estimate(in, cut_rows);
        pthread_cond_signal(&in->cv);
    }
    m->batcher_started = false; /* the instances leave once idle */
    for (int i = 0; i < m->ninstances; i++) pthread_cond_broadcast(&m->inst[i].cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* ---- requests ------------------------------------------------------------------------ */

static const char *dims_str(const int64_t *d, int nd, int64_t lead, char *buf, size_t n)
{
    size_t w = (size_t)snprintf(buf, n, "[%lld", (long long)lead);
    for (int i = 0; i < nd && w < n; i++) w += (size_t)snprintf(buf + w, n - w, ", %lld", (long long)d[i]);
    if (w < n) snprintf(buf + w, n - w, "]");
    return buf;
}

int ems_job_from_request(ems_model *m, const ems_request *req, ems_job *job, char *err, size_t nerr)
{
    memset(job, 0, sizeof *job);
    pthread_mutex_init(&job->mu, NULL);
    cond_init_mono(&job->cv);
    const char *iname = m->cfg.input_name;
    if (req->ninputs != 1 || strcmp(req->inputs[0].name, iname)) {
        const char *got = req->ninputs > 0 ? req->inputs[0].name : "";
        if (req->ninputs == 0) snprintf(err, nerr, "the request has no input: model '%s' takes one, '%s'", m->name, iname);
        else if (req->ninputs > 1) snprintf(err, nerr, "the request has %d inputs: model '%s' takes one, '%s'", req->ninputs, m->name, iname);
        else snprintf(err, nerr, "unexpected input '%s': model '%s' takes one input, '%s'", got, m->name, iname);
        return 400;
    }
    const ems_tensor *t = &req->inputs[0];
    if (t->dtype != m->cfg.input_dtype) {
        snprintf(err, nerr, "input '%s': datatype %s, model '%s' expects %s", iname, ems_dtype_name(t->dtype), m->name,
                 ems_dtype_name(m->cfg.input_dtype));
        return 400;
    }
    char want[160], got[160];
    bool shape_ok = t->ndim == 1 + m->ndim && t->shape[0] >= 1 && t->shape[0] <= m->cfg.max_batch_size;
    for (int i = 0; shape_ok && i < m->ndim; i++)
        shape_ok = m->dims[i] < 0 ? (t->shape[1 + i] >= 1 && t->shape[1 + i] <= m->max_seq) : t->shape[1 + i] == m->dims[i];
    if (!shape_ok) {
        size_t w = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->ndim && w < sizeof got; i++) w += (size_t)snprintf(got + w, sizeof got - w, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (w < sizeof got) snprintf(got + w, sizeof got - w, "]");
        dims_str(m->dims, m->ndim, -1, want, sizeof want);
        if (t->ndim == 1 + m->ndim && (t->shape[0] < 1 || t->shape[0] > m->cfg.max_batch_size))
            snprintf(err, nerr, "input '%s': shape %s: the batch dimension must be 1 to %lld (max_batch_size of model '%s')", iname, got,
                     (long long)m->cfg.max_batch_size, m->name);
        else if (m->kind == EMS_KIND_GPT)
            snprintf(err, nerr, "input '%s': shape %s does not match %s of model '%s' (batch, tokens: 1 to %lld tokens)", iname, got, want, m->name,
                     (long long)m->max_seq);
        else
            snprintf(err, nerr, "input '%s': shape %s does not match %s of model '%s'", iname, got, want, m->name);
        return 400;
    }
    for (int i = 0; i < req->noutputs; i++) {
        const char *o = req->outputs[i].name;
        if (strcmp(o, "logits") && (m->kind == EMS_KIND_GPT || strcmp(o, "probabilities"))) {
            snprintf(err, nerr, "unknown output '%s': model '%s' has %s", o, m->name,
                     m->kind == EMS_KIND_GPT ? "'logits'" : "'logits' and 'probabilities'");
            return 400;
        }
        if (!strcmp(o, "probabilities")) job->want_probs = true;
    }
    if (req->noutputs == 0 && m->kind == EMS_KIND_CLASSIFIER) job->want_probs = true;
    job->rows = t->shape[0];
    job->sample = t->numel / job->rows;
    if (m->kind == EMS_KIND_GPT) {
        job->xi = malloc((size_t)t->numel * sizeof(int64_t));
        if (!job->xi) {
            snprintf(err, nerr, "out of memory");
            return 500;
        }
        if (ems_tensor_to_i64(t, job->xi) != 0) {
            snprintf(err, nerr, "input '%s': values out of the int64 range", iname);
            return 400;
        }
        for (int64_t i = 0; i < t->numel; i++)
            if (job->xi[i] < 0 || job->xi[i] >= m->out_cols) {
                snprintf(err, nerr, "input '%s': token id %lld at index %lld is out of range [0, %lld) of model '%s'", iname,
                         (long long)job->xi[i], (long long)i, (long long)m->out_cols, m->name);
                return 400;
            }
    } else {
        job->xf = malloc((size_t)t->numel * sizeof(float));
        if (!job->xf) {
            snprintf(err, nerr, "out of memory");
            return 500;
        }
        ems_tensor_to_f32(t, job->xf);
        if (m->normalize) { /* (x - mean[c]) / std[c], c the channel of the per-sample layout [C, ...] */
            const int64_t per = m->sample / m->nchan;
            for (int64_t i = 0; i < t->numel; i++) {
                int ch = (int)((i % m->sample) / per);
                job->xf[i] = (job->xf[i] - m->mean[ch]) / m->std[ch];
            }
        }
    }
    int64_t to = m->cfg.default_timeout_us;
    if (req->timeout_us > 0 && m->cfg.allow_timeout_override) to = req->timeout_us;
    job->t_enqueue = ems_now();
    job->t_deadline = to > 0 ? job->t_enqueue + 1e-6 * (double)to : 0;
    job->http_status = 0;
    return 0;
}

void ems_model_run(ems_model *m, ems_job *job)
{
    pthread_mutex_lock(&m->mu);
    if (m->stopping) {
        m->n_overload++;
        pthread_mutex_unlock(&m->mu);
        job->http_status = 503;
        snprintf(job->err, sizeof job->err, "model '%s' is unloading: the server is shutting down", m->name);
        return;
    }
    if (m->queued >= m->cfg.max_queue_size) {
        m->n_overload++;
        pthread_mutex_unlock(&m->mu);
        job->http_status = 503;
        snprintf(job->err, sizeof job->err, "model '%s' is overloaded: its queue holds %lld requests (max_queue_size %lld); retry later",
                 m->name, (long long)m->queued, (long long)m->cfg.max_queue_size);
        return;
    }
    job->t_enqueue = ems_now();
    if (m->tail) m->tail->next = job;
    else m->head = job;
    m->tail = job;
    m->queued++;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_mutex_lock(&job->mu);
    while (!job->done) pthread_cond_wait(&job->cv, &job->mu);
    pthread_mutex_unlock(&job->mu);
}

void ems_job_free(ems_job *job)
{
    free(job->xf);
    free(job->xi);
    free(job->out[0]);
    free(job->out[1]);
    pthread_mutex_destroy(&job->mu);
    pthread_cond_destroy(&job->cv);
}

/* ---- loading ----------------------------------------------------------------------------- */

static em_module *build_module(ems_model *m, const ems_options *o, char *err, size_t nerr)
{
    em_module *mod;
    if (m->kind == EMS_KIND_GPT) {
        em_gpt2_config g;
        if (em_gpt2_config_parse(m->spec, &g) != EM_OK) {
            snprintf(err, nerr, "%s: metadata 'ember.model': %s", m->path, em_last_error());
            return NULL;
        }
        mod = em_gpt2_new(&g);
        if (!mod) {
            snprintf(err, nerr, "%s: %s", m->path, em_last_error());
            return NULL;
        }
        m->max_seq = g.n_positions;
        m->out_cols = g.vocab_size;
        m->ndim = 1;
        m->dims[0] = -1;
    } else {
        int64_t dims[EMS_MAX_RANK];
        int nd = 0;
        char e2[512] = "";
        mod = o->build_classifier ? o->build_classifier(m->spec, dims, &nd, e2, sizeof e2) : NULL;
        if (!mod) {
            snprintf(err, nerr, "%s: model '%.200s' (metadata 'ember.model'): %s", m->path, m->spec,
                     o->build_classifier ? e2 : "no classifier builder");
            return NULL;
        }
        m->sample = 1;
        for (int i = 0; i < nd; i++) m->sample *= dims[i];
        if (m->cfg.input_ndim > 0) {
            int64_t s = 1;
            for (int i = 0; i < m->cfg.input_ndim; i++) s *= m->cfg.input_dims[i];
            if (s != m->sample || m->cfg.input_dims[0] < 0) {
                char b1[128], b2[128];
                snprintf(err, nerr, "config.json input dims %s do not fit the model's input %s (%lld values per sample)",
                         dims_str(m->cfg.input_dims, m->cfg.input_ndim, -1, b1, sizeof b1), dims_str(dims, nd, -1, b2, sizeof b2),
                         (long long)m->sample);
                em_module_free(mod);
                return NULL;
            }
            m->ndim = m->cfg.input_ndim;
            memcpy(m->dims, m->cfg.input_dims, sizeof m->dims);
        } else {
            m->ndim = nd;
            memcpy(m->dims, dims, (size_t)nd * sizeof *dims);
        }
        m->nchan = nd == 3 ? (int)dims[0] : 1; /* the input's channels (a CNN's C) */
    }
    if (em_checkpoint_load(m->path, mod, NULL, NULL, NULL) != EM_OK) {
        snprintf(err, nerr, "%s", em_last_error());
        em_module_free(mod);
        return NULL;
    }
    em_module_train(mod, false);
    return mod;
}

/* Reads an `ember train` checkpoint's metadata at m->path: its architecture
 * ('ember.model' -> m->spec, m->kind) and, when config.json leaves the
 * normalisation to the checkpoint (cfg->norm -1), its ember.norm_mean /
 * ember.norm_std. 0, or -1 with the reason in @p err. */
static int read_checkpoint_meta(ems_model *m, const ems_model_config *cfg, char *err, size_t nerr)
{
    const char *path = m->path;
    em_st_file *f = em_safetensors_open(path);
    if (!f) {
        snprintf(err, nerr, "%s", em_last_error());
        return -1;
    }
    const char *spec = em_safetensors_metadata(f, "ember.model");
    if (!spec || strlen(spec) >= sizeof m->spec) {
        snprintf(err, nerr, "%s: %s", path, spec ? "metadata 'ember.model' is too long" :
                 "no 'ember.model' metadata: not a checkpoint written by ember train");
        em_safetensors_close(f);
        return -1;
    }
    snprintf(m->spec, sizeof m->spec, "%s", spec);
    m->kind = !strncmp(spec, "gpt:", 4) ? EMS_KIND_GPT : EMS_KIND_CLASSIFIER;
    if (m->kind == EMS_KIND_CLASSIFIER && cfg->norm == -1) {
        const char *ms = em_safetensors_metadata(f, "ember.norm_mean"), *ss = em_safetensors_metadata(f, "ember.norm_std");
        if (ms || ss) {
            int a = parse_norm_list(ms, m->mean, EMS_NORM_MAX), b = parse_norm_list(ss, m->std, EMS_NORM_MAX);
            bool ok = a >= 1 && a == b;
            for (int i = 0; ok && i < a; i++) ok = isfinite(m->mean[i]) && isfinite(m->std[i]) && m->std[i] > 0;
            if (!ok) {
                snprintf(err, nerr, "%s: bad normalisation metadata (ember.norm_mean '%.60s', ember.norm_std '%.60s')", path, ms ? ms : "",
                         ss ? ss : "");
                em_safetensors_close(f);
                return -1;
            }
            m->normalize = true;
            m->nnorm = a;
        }
    }
    em_safetensors_close(f);
    return 0;
}

/* Checks the normalisation's statistics against the input's channels (1
 * value broadcasts to every channel). 0, or -1 with the reason in @p err. */
static int check_norm(ems_model *m, char *err, size_t nerr)
{
    if (!m->normalize) return 0;
    if (m->nchan > EMS_NORM_MAX) {
        snprintf(err, nerr, "the input has %d channels: normalisation covers at most %d", m->nchan, EMS_NORM_MAX);
        return -1;
    }
    if (m->nnorm != 1 && m->nnorm != m->nchan) {
        char give[32] = "1";
        if (m->nchan > 1) snprintf(give, sizeof give, "1 or %d", m->nchan);
        snprintf(err, nerr, "the normalisation has %d values per statistic but the model's input has %d channel%s (give %s)", m->nnorm,
                 m->nchan, m->nchan == 1 ? "" : "s", give);
        return -1;
    }
    if (m->nnorm == 1) /* one value for every channel */
        for (int c = 1; c < m->nchan && c < EMS_NORM_MAX; c++) {
            m->mean[c] = m->mean[0];
            m->std[c] = m->std[0];
        }
    return 0;
}

static void model_stop_threads(ems_model *m)
{
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    pthread_cond_broadcast(&m->cv);
    for (int i = 0; i < m->ninstances; i++) pthread_cond_broadcast(&m->inst[i].cv);
    pthread_mutex_unlock(&m->mu);
    if (m->batcher_started) pthread_join(m->batcher, NULL);
    pthread_mutex_lock(&m->mu);
    m->batcher_started = false;
    for (int i = 0; i < m->ninstances; i++) pthread_cond_broadcast(&m->inst[i].cv);
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < m->ninstances; i++)
        if (m->inst[i].started) {
            pthread_join(m->inst[i].thread, NULL);
            m->inst[i].started = false;
        }
}

ems_model *ems_model_load(const char *name, int64_t version, const char *path, const ems_model_config *cfg, const ems_options *o,
                          const ems_instance_spec *def_inst, int ndef, char *err, size_t nerr)
{
    ems_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, nerr, "out of memory");
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    m->version = version;
    snprintf(m->version_str, sizeof m->version_str, "%lld", (long long)version);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->cfg = *cfg;
    pthread_mutex_init(&m->mu, NULL);
    cond_init_mono(&m->cv);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(err, nerr, "%s: %s", path, errno == ENOENT ? "no such file" : strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, nerr, "%s: not a regular file", path);
        goto fail;
    }
    size_t plen = strlen(path);
    m->onnx = plen >= 5 && !strcmp(path + plen - 5, ".onnx");
    if (m->onnx) { /* an ONNX classifier: each instance loads and checks the file on its own thread (instance_main) */
        m->kind = EMS_KIND_CLASSIFIER;
        snprintf(m->spec, sizeof m->spec, "onnx");
    } else if (read_checkpoint_meta(m, cfg, err, nerr) != 0) {
        goto fail;
    }
    /* normalisation: config.json's, else a checkpoint's own (read_checkpoint_meta), else none (always for ONNX) */
    if (m->kind == EMS_KIND_CLASSIFIER && cfg->norm == 1) {
        m->normalize = true;
        m->nnorm = cfg->nnorm;
        memcpy(m->mean, cfg->mean, sizeof m->mean);
        memcpy(m->std, cfg->std, sizeof m->std);
    }
    if (m->kind == EMS_KIND_GPT && cfg->norm == 1) {
        snprintf(err, nerr, "config.json \"normalize\" applies to classifiers, not to a GPT");
        goto fail;
    }
    if (!m->cfg.input_name[0] && !m->onnx) snprintf(m->cfg.input_name, sizeof m->cfg.input_name, "%s", m->kind == EMS_KIND_GPT ? "input_ids" : "input");
    if (m->cfg.input_dtype == EMS_DTYPE_COUNT) m->cfg.input_dtype = m->kind == EMS_KIND_GPT ? EMS_INT64 : EMS_FP32;
    if ((m->kind == EMS_KIND_GPT) != (m->cfg.input_dtype != EMS_FP32)) {
        snprintf(err, nerr, "config.json input data_type %s does not fit a %s", ems_dtype_name(m->cfg.input_dtype),
                 m->kind == EMS_KIND_GPT ? "GPT (TYPE_INT64 or TYPE_INT32 ids)" : "classifier (TYPE_FP32)");
        goto fail;
    }
    if (m->kind == EMS_KIND_GPT && m->cfg.input_ndim > 0 && (m->cfg.input_ndim != 1 || m->cfg.input_dims[0] != -1)) {
        snprintf(err, nerr, "config.json input dims of a GPT must be [-1] (tokens)");
        goto fail;
    }
    const ems_instance_spec *is = cfg->ninstances > 0 ? cfg->instances : def_inst;
    m->ninstances = cfg->ninstances > 0 ? cfg->ninstances : ndef;
    m->inst = calloc((size_t)m->ninstances, sizeof *m->inst);
    if (!m->inst) {
        snprintf(err, nerr, "out of memory");
        goto fail;
    }
    for (int i = 0; i < m->ninstances; i++) {
        ems_instance *in = &m->inst[i];
        in->model = m;
        in->index = i;
        in->device = is[i].device;
        em_device_str(in->device, in->device_name, sizeof in->device_name);
        cond_init_mono(&in->cv);
        if (!m->onnx) { /* an ONNX instance loads its model on its own thread */
            in->module = build_module(m, o, err, nerr);
            if (!in->module) goto fail;
        }
        inst_start st = {.in = in};
        pthread_mutex_init(&st.mu, NULL);
        pthread_cond_init(&st.cv, NULL);
        if (pthread_create(&in->thread, NULL, instance_main, &st) != 0) {
            snprintf(err, nerr, "cannot start a thread");
            goto fail;
        }
        in->started = true;
        pthread_mutex_lock(&st.mu);
        while (st.status == 0) pthread_cond_wait(&st.cv, &st.mu);
        pthread_mutex_unlock(&st.mu);
        if (st.status < 0) {
            pthread_join(in->thread, NULL);
            in->started = false;
            snprintf(err, nerr, "%s", st.err);
            goto fail;
        }
        /* the classifier's class count comes from its first forward; the
         * input's channels (an ONNX model's request shape) are known now */
        if (i == 0 && check_norm(m, err, nerr) != 0) goto fail;
    }
    for (int i = 0; i < cfg->noutput_dims; i++)
        if (cfg->output_dims[i] != m->out_cols) {
            snprintf(err, nerr, "config.json output '%s' has dims [%lld] but the model gives [%lld]", cfg->output_dims_name[i],
                     (long long)cfg->output_dims[i], (long long)m->out_cols);
            goto fail;
        }
    m->batcher_started = true;
    if (pthread_create(&m->batcher, NULL, batcher_main, m) != 0) {
        m->batcher_started = false;
        snprintf(err, nerr, "cannot start a thread");
        goto fail;
    }
    return m;
fail:
    ems_model_free(m);
    return NULL;
}

void ems_model_free(ems_model *m)
{
    if (!m) return;
    model_stop_threads(m);
    for (int i = 0; i < m->ninstances && m->inst; i++) {
        em_module_free(m->inst[i].module);
        pthread_cond_destroy(&m->inst[i].cv);
    }
    free(m->inst);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}

/* ---- Prometheus metrics ------------------------------------------------------------------- */

void ems_buf_printf(struct ems_buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = true;
            return;
        }
        if (b->p && (size_t)w < room) {
            b->n += (size_t)w;
            return;
        }
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + (size_t)w + 1) nc *= 2;
        char *t = realloc(b->p, nc);
        if (!t) {
            b->oom = true;
            return;
        }
        b->p = t;
        b->cap = nc;
    }
}

/* One model's histogram: cumulative buckets at @p le[0..n-1], +Inf, _sum, _count. */
static void write_hist(struct ems_buf *b, const char *name, const ems_model *m, const uint64_t *hist, int n, const char *const *le,
                       double sum)
{
    uint64_t cum = 0;
    for (int k = 0; k <= n; k++) {
        cum += hist[k];
        ems_buf_printf(b, "%s_bucket{model=\"%s\",version=\"%s\",le=\"%s\"} %llu\n", name, m->name, m->version_str, k < n ? le[k] : "+Inf",
                       (unsigned long long)cum);
    }
    ems_buf_printf(b, "%s_sum{model=\"%s\",version=\"%s\"} %.9g\n%s_count{model=\"%s\",version=\"%s\"} %llu\n", name, m->name,
                   m->version_str, sum, name, m->name, m->version_str, (unsigned long long)cum);
}

void ems_metrics_write(ems_repo *r, struct ems_buf *b, int64_t in_flight, uint64_t http[6])
{
    static const char *const outcomes[] = {"success", "bad_request", "overload", "timeout", "error"};
    static const char *const tle[EMS_HIST_T] = {"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.05", "0.1", "1", "10"};
    static const char *const cls[] = {"1xx", "2xx", "3xx", "4xx", "5xx", "other"};
    char bsle_buf[EMS_HIST_BS][24];
    const char *bsle[EMS_HIST_BS];
    for (int k = 0; k < EMS_HIST_BS; k++) {
        snprintf(bsle_buf[k], sizeof bsle_buf[k], "%lld", (long long)1 << k);
        bsle[k] = bsle_buf[k];
    }
    ems_buf_printf(b, "# HELP ember_http_requests_total HTTP requests by status class.\n# TYPE ember_http_requests_total counter\n");
    for (int i = 0; i < 6; i++) ems_buf_printf(b, "ember_http_requests_total{code=\"%s\"} %llu\n", cls[i], (unsigned long long)http[i]);
    ems_buf_printf(b, "# HELP ember_inference_in_flight_requests Requests being received, decoded, queued or computed.\n"
                      "# TYPE ember_inference_in_flight_requests gauge\nember_inference_in_flight_requests %lld\n", (long long)in_flight);
    /* one consistent copy of every model's numbers, then the text */
    typedef struct {
        uint64_t out[5], hq[EMS_HIST_T + 1], hc[EMS_HIST_T + 1], hb[EMS_HIST_BS + 1], batches[EMS_MAX_INSTANCES], rows[EMS_MAX_INSTANCES];
        double sq, sc, sb;
        int64_t queued;
    } snap;
    snap *sn = calloc((size_t)(r->n ? r->n : 1), sizeof *sn);
    if (!sn) {
        b->oom = true;
        return;
    }
    for (int i = 0; i < r->n; i++) {
        ems_model *m = r->models[i];
        snap *x = &sn[i];
        pthread_mutex_lock(&m->mu);
        uint64_t o[5] = {m->n_success, m->n_bad, m->n_overload, m->n_timeout, m->n_error};
        memcpy(x->out, o, sizeof o);
        memcpy(x->hq, m->hist_q, sizeof x->hq);
        memcpy(x->hc, m->hist_c, sizeof x->hc);
        memcpy(x->hb, m->hist_bs, sizeof x->hb);
        for (int k = 0; k < m->ninstances; k++) {
            x->batches[k] = m->inst[k].batches;
            x->rows[k] = m->inst[k].rows_done;
        }
        x->sq = m->sum_q;
        x->sc = m->sum_c;
        x->sb = m->sum_bs;
        x->queued = m->queued;
        pthread_mutex_unlock(&m->mu);
    }
    ems_buf_printf(b, "# HELP ember_inference_requests_total Infer requests by model, version and outcome.\n"
                      "# TYPE ember_inference_requests_total counter\n");
    for (int i = 0; i < r->n; i++)
        for (int k = 0; k < 5; k++)
            ems_buf_printf(b, "ember_inference_requests_total{model=\"%s\",version=\"%s\",outcome=\"%s\"} %llu\n", r->models[i]->name,
                           r->models[i]->version_str, outcomes[k], (unsigned long long)sn[i].out[k]);
    ems_buf_printf(b, "# HELP ember_inference_queue_size Requests waiting in the model's queue.\n# TYPE ember_inference_queue_size gauge\n");
    for (int i = 0; i < r->n; i++)
        ems_buf_printf(b, "ember_inference_queue_size{model=\"%s\",version=\"%s\"} %lld\n", r->models[i]->name, r->models[i]->version_str,
                       (long long)sn[i].queued);
    static const char *const hn[3] = {"ember_inference_queue_duration_seconds", "ember_inference_compute_duration_seconds",
                                      "ember_inference_batch_size"};
    static const char *const hh[3] = {"Time a request waited in the queue before its batch started.",
                                      "Time of the batch forward (input upload to outputs on the host) a request was part of.",
                                      "Rows per executed batch."};
    for (int h = 0; h < 3; h++) {
        ems_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", hn[h], hh[h], hn[h]);
        for (int i = 0; i < r->n; i++) {
            const snap *x = &sn[i];
            if (h < 2) write_hist(b, hn[h], r->models[i], h ? x->hc : x->hq, EMS_HIST_T, tle, h ? x->sc : x->sq);
            else write_hist(b, hn[h], r->models[i], x->hb, EMS_HIST_BS, bsle, x->sb);
        }
    }
    static const char *const cn[2] = {"ember_inference_batches_total", "ember_inference_rows_total"};
    static const char *const ch[2] = {"Batches executed by model instance and device.", "Rows (samples) computed by model instance and device."};
    for (int c = 0; c < 2; c++) {
        ems_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", cn[c], ch[c], cn[c]);
        for (int i = 0; i < r->n; i++) {
            ems_model *m = r->models[i];
            for (int k = 0; k < m->ninstances; k++)
                ems_buf_printf(b, "%s{model=\"%s\",version=\"%s\",instance=\"%d\",device=\"%s\"} %llu\n", cn[c], m->name, m->version_str, k,
                               m->inst[k].device_name, (unsigned long long)(c ? sn[i].rows[k] : sn[i].batches[k]));
        }
    }
    free(sn);
}

/* ---- the offline benchmark (ember serve --benchmark) --------------------------------------------- */

typedef struct {
    ems_instance *in;
    int64_t rows, sample;
    double seconds, elapsed;
    int64_t batches;
    int rc;
    char err[512];
} bench_arg;

static void *bench_main(void *p)
{
    bench_arg *a = p;
    ems_instance *in = a->in;
    ems_model *m = in->model;
    ems_job j;
    memset(&j, 0, sizeof j);
    j.rows = a->rows;
    j.sample = a->sample;
    j.want_probs = m->kind == EMS_KIND_CLASSIFIER;
    if (m->kind == EMS_KIND_GPT) {
        j.xi = malloc((size_t)(a->rows * a->sample) * sizeof(int64_t));
        for (int64_t i = 0; j.xi && i < a->rows * a->sample; i++) j.xi[i] = (i * 7 + 3) % m->out_cols;
    } else {
        j.xf = malloc((size_t)(a->rows * a->sample) * sizeof(float));
        for (int64_t i = 0; j.xf && i < a->rows * a->sample; i++) j.xf[i] = (float)((i * 37) % 101) / 100.0f;
    }
    a->rc = -1;
    if ((!j.xi && !j.xf) || em_set_thread_device(in->device) != EM_OK) {
        snprintf(a->err, sizeof a->err, "cannot start on %s: %s", in->device_name, em_last_error());
        goto out;
    }
    double t0 = ems_now();
    do {
        free(j.out[0]);
        free(j.out[1]);
        j.out[0] = j.out[1] = NULL;
        if (run_batch(in, &j, a->rows, a->err, sizeof a->err) != 0) goto out;
        a->batches++;
        a->elapsed = ems_now() - t0;
    } while (a->elapsed < a->seconds);
    a->rc = 0;
out:
    em_clear_thread_device();
    em_thread_exit();
    free(j.xi);
    free(j.xf);
    free(j.out[0]);
    free(j.out[1]);
    return NULL;
}

int ems_model_benchmark(ems_model *m, double seconds, FILE *out)
{
    bench_arg *a = calloc((size_t)m->ninstances, sizeof *a);
    pthread_t *th = calloc((size_t)m->ninstances, sizeof *th);
    if (!a || !th) {
        free(a);
        free(th);
        return -1;
    }
    const int64_t rows = m->cfg.max_batch_size;
    const int64_t sample = m->kind == EMS_KIND_GPT ? (m->max_seq < EMS_BENCH_TOKENS ? m->max_seq : EMS_BENCH_TOKENS) : m->sample;
    /* one warm-up batch per instance, then every instance at once */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < m->ninstances; i++) {
            memset(&a[i], 0, sizeof a[i]);
            a[i].in = &m->inst[i];
            a[i].rows = rows;
            a[i].sample = sample;
            a[i].seconds = pass ? seconds : 0;
            if (pthread_create(&th[i], NULL, bench_main, &a[i]) != 0) a[i].rc = -2;
            if (!pass && a[i].rc != -2) pthread_join(th[i], NULL); /* warm-ups one by one */
        }
        if (pass)
            for (int i = 0; i < m->ninstances; i++)
                if (a[i].rc != -2) pthread_join(th[i], NULL);
    }
    int rc = 0;
    double total = 0;
    for (int i = 0; i < m->ninstances; i++) {
        if (a[i].rc != 0) {
            fprintf(out, "benchmark %s version %s: instance %d (%s) failed: %s\n", m->name, m->version_str, i, m->inst[i].device_name,
                    a[i].rc == -2 ? "cannot start a thread" : a[i].err);
            rc = -1;
            continue;
        }
        double rps = (double)(a[i].batches * rows) / a[i].elapsed;
        total += rps;
        char tok[48] = "";
        if (m->kind == EMS_KIND_GPT) snprintf(tok, sizeof tok, " of %lld tokens", (long long)sample);
        fprintf(out, "benchmark %s version %s: instance %d %s: %lld batches of %lld rows%s in %.2f s = %.1f rows/s (%.3f ms per batch)\n",
                m->name, m->version_str, i, m->inst[i].device_name, (long long)a[i].batches, (long long)rows, tok, a[i].elapsed, rps,
                1e3 * a[i].elapsed / (double)a[i].batches);
    }
    if (rc == 0)
        fprintf(out, "benchmark %s version %s: offline total %.1f rows/s on %d instance%s (max_batch_size %lld%s)\n", m->name,
                m->version_str, total, m->ninstances, m->ninstances == 1 ? "" : "s", (long long)rows,
                m->kind == EMS_KIND_GPT ? ", rows of up to 128 tokens" : "");
    fflush(out);
    free(a);
    free(th);
    return rc;
}
