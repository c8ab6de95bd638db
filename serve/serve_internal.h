/* Internals shared by serve/repository.c, serve/model.c and serve/http.c. */
#ifndef EMBER_SERVE_INTERNAL_H
#define EMBER_SERVE_INTERNAL_H

#include "serve/server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#define EMS_MAX_PREFERRED 16
#define EMS_MAX_VERSIONS 64
#define EMS_NORM_MAX 64
#define EMS_MAX_OUTPUTS 2
/* warm-up passes per instance at load; a placement estimate older than this is measured again (seconds) */
#define EMS_WARMUP 3
#define EMS_WARMUP_ROWS 64 /* the warm-up's full batch, at most */
#define EMS_REMEASURE_S 1.0
/* batch-size histogram buckets: 1, 2, 4, ..., 2^(EMS_HIST_BS - 1), +Inf */
#define EMS_HIST_BS 14
/* duration histogram buckets (seconds): 1e-4 .. 10, +Inf */
#define EMS_HIST_T 11

typedef enum ems_model_kind {
    EMS_KIND_CLASSIFIER, /**< input [N, dims...] FP32 -> "logits", "probabilities" [N, K] (an Ember
                              checkpoint's MLP / CNN, or an ONNX model: ems_model.onnx) */
    EMS_KIND_GPT,        /**< input_ids [N, T] INT64 (or INT32) -> "logits" [N, vocab] of the last position */
} ems_model_kind;

/** A model's configuration: config.json merged over the defaults. */
typedef struct ems_model_config {
    int64_t max_batch_size;                  /**< rows per batch (default 64) */
    int npreferred;
    int64_t preferred[EMS_MAX_PREFERRED];    /**< preferred_batch_size, ascending */
    int64_t max_queue_delay_us;              /**< default 0 (as Triton) */
    int64_t max_queue_size;                  /**< queued requests at most (default 1024; Triton's 0 = unbounded is not offered) */
    int64_t default_timeout_us;              /**< 0 = none */
    bool allow_timeout_override;             /**< a request's parameters.timeout may set its own (default true) */
    int ninstances;                          /**< 0: the server's --instances */
    ems_instance_spec instances[EMS_MAX_INSTANCES];
    char input_name[EMS_NAME_MAX];           /**< "input" / "input_ids" by default */
    ems_dtype input_dtype;                   /**< FP32 / INT64 by default */
    int input_ndim;                          /**< per-sample dims from config (0: the model's own) */
    int64_t input_dims[EMS_MAX_RANK];
    int norm;                                /**< -1 from the checkpoint (ONNX: none), 0 none, 1 config's mean/std */
    enum { EMS_FORMAT_ANY, EMS_FORMAT_EMBER, EMS_FORMAT_ONNX } format; /**< "platform" / "backend": which
                                                  file a version folder serves (ANY: the one present) */
    int nnorm;
    float mean[EMS_NORM_MAX], std[EMS_NORM_MAX];
    enum { EMS_VERSIONS_LATEST, EMS_VERSIONS_ALL, EMS_VERSIONS_SPECIFIC } version_policy;
    int noutput_dims;                        /**< outputs whose "dims" config.json gives (checked at load) */
    int64_t output_dims[EMS_MAX_OUTPUTS];
    char output_dims_name[EMS_MAX_OUTPUTS][16];
    int latest_n;
    int nspecific;
    int64_t specific[EMS_MAX_VERSIONS];
} ems_model_config;

struct ems_model;

/** One request waiting in a model's queue (owned by the HTTP thread that
 *  waits for it; the batcher and the instance only fill it in). */
typedef struct ems_job {
    struct ems_job *next;
    int64_t rows;          /**< its batch dim */
    int64_t sample;        /**< values per row (classifier: prod(dims); GPT: T) */
    float *xf;             /**< classifier rows, normalised [rows * sample] */
    int64_t *xi;           /**< GPT ids [rows * sample] */
    bool want_probs;
    double t_enqueue, t_deadline; /**< seconds (CLOCK_MONOTONIC); deadline 0 = none */
    /* results */
    int http_status;       /**< 200, or the error's status */
    char err[512];
    float *out[EMS_MAX_OUTPUTS]; /**< [rows * out_cols] each; out[1] (probabilities) only when want_probs */
    int64_t out_cols;
    double queue_s, compute_s;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} ems_job;

/** One model instance: a thread with its own copy of the module on one device. */
typedef struct ems_instance {
    struct ems_model *model;
    int index;
    em_device device;
    char device_name[32];
    em_module *module;     /**< an Ember checkpoint's module (owned; NULL for ONNX) */
    em_onnx_model *onnx;   /**< an ONNX model's own copy (owned; em_onnx_load'ed and em_onnx_free'd on
                                the instance's thread, on its device; NULL for a checkpoint) */
    pthread_t thread;
    bool started;
    /* under model->mu */
    ems_job *batch;        /**< the batch handed to it (a list), NULL when idle */
    int64_t batch_rows;
    double busy_until;     /**< predicted end of its current batch */
    double est[EMS_HIST_BS + 8]; /**< EWMA seconds per batch, by ceil(log2(rows)); 0 = not measured */
    double est_t[EMS_HIST_BS + 8]; /**< when est[b] was last updated (ems_now) */
    pthread_cond_t cv;
    /* metrics */
    uint64_t batches, rows_done;
} ems_instance;

/** One served (model, version). */
typedef struct ems_model {
    char name[EMS_NAME_MAX];
    int64_t version;
    char version_str[24];
    char path[4096];
    ems_model_kind kind;
    bool onnx;                       /**< path is a model.onnx (a classifier: one FLOAT input
                                          [N, static dims...], first output the logits [N, K]) */
    ems_model_config cfg;
    char spec[1024];                 /**< 'ember.model' */
    int64_t dims[EMS_MAX_RANK];      /**< per-sample input dims of requests (GPT: [-1]) */
    int ndim;
    int64_t sample;                  /**< prod(dims) (classifier) */
    int64_t out_cols;                /**< K or the vocabulary size */
    int64_t max_seq;                 /**< GPT: n_positions */
    int nchan;                       /**< input channels: C of a CNN's [C, H, W], else 1 */
    int nnorm;                       /**< values per statistic given (1, broadcast, or nchan) */
    float mean[EMS_NORM_MAX], std[EMS_NORM_MAX];
    bool normalize;
    int ninstances;
    ems_instance *inst;
    /* the queue and the batcher, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;               /**< the batcher waits here: new job, instance free, stop */
    ems_job *head, *tail;
    int64_t queued;                  /**< requests in the queue */
    bool stopping;
    bool flush;                      /**< draining: batches go without waiting for max_queue_delay */
    pthread_t batcher;
    bool batcher_started;
    /* metrics, under mu */
    uint64_t n_success, n_bad, n_overload, n_timeout, n_error;
    uint64_t hist_bs[EMS_HIST_BS + 1];
    uint64_t n_batches;
    uint64_t hist_q[EMS_HIST_T + 1], hist_c[EMS_HIST_T + 1];
    double sum_q, sum_c, sum_bs;
    uint64_t n_q;
} ems_model;

/** The set of served models. */
typedef struct ems_repo {
    int n;
    ems_model **models;
} ems_repo;

double ems_now(void);

/** Reads DIR/<model>/config.json (when present) into @p cfg (defaults first).
 *  0, or -1 with the file, key and reason in @p err. */
int ems_config_read(const char *path, const char *model_name, ems_model_config *cfg, char *err, size_t nerr);
void ems_config_default(ems_model_config *cfg);

/** Scans the repository: every model folder, its versions by policy, each
 *  loaded and started (instances on their devices, the batcher). A model
 *  that fails is reported on stderr and skipped. 0 with @p out filled (at
 *  least one model), or -1 (nothing to serve; the reasons printed). */
int ems_repo_load(const char *dir, const ems_options *o, const ems_instance_spec *def_inst, int ndef, ems_repo *out);
/** The server is draining: every model's queued requests go out at once
 *  (no max_queue_delay wait). */
void ems_repo_flush(ems_repo *r);
/** Stops every model (its queue drained: queued jobs still run) and frees it. */
void ems_repo_free(ems_repo *r);

/** Loads one (model, version) from @p path (a model.safetensors checkpoint,
 *  or a model.onnx when the name ends in ".onnx") and starts its instances
 *  and batcher. NULL with the reason in @p err. */
ems_model *ems_model_load(const char *name, int64_t version, const char *path, const ems_model_config *cfg,
                          const ems_options *o, const ems_instance_spec *def_inst, int ndef, char *err, size_t nerr);
void ems_model_free(ems_model *m);

/** Tokens per row of a GPT's offline benchmark (or n_positions when smaller). */
#define EMS_BENCH_TOKENS 128
/** The offline benchmark of `ember serve --benchmark S`: every instance of @p m
 *  runs batches of max_batch_size rows (a GPT's of EMS_BENCH_TOKENS tokens)
 *  back to back, all at once, for @p seconds, after one warm-up batch each;
 *  prints rows/s per instance and in total to @p out. The same forward as
 *  the server's (run_batch), without HTTP, queue or batcher. 0, or -1. */
int ems_model_benchmark(ems_model *m, double seconds, FILE *out);

/** Checks @p req against the model and turns it into a job (its inputs
 *  converted and normalised). 0, or the HTTP status (400) with the reason
 *  in @p err. */
int ems_job_from_request(ems_model *m, const ems_request *req, ems_job *job, char *err, size_t nerr);
/** Queues @p job and waits until it is done (job->http_status). 503 at
 *  once when the queue is full or the model is stopping. */
void ems_model_run(ems_model *m, ems_job *job);
void ems_job_free(ems_job *job);

/** Appends this model's Prometheus text (metrics lines) to the buffer. */
struct ems_buf {
    char *p;
    size_t n, cap;
    bool oom;
};
void ems_buf_printf(struct ems_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ems_metrics_write(ems_repo *r, struct ems_buf *b, int64_t in_flight, uint64_t http_requests[6]);

#endif
