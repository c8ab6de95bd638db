/* Ember training: checkpoints, the Learner loop, metrics.
 *
 * A checkpoint is one SafeTensors file: model parameters and buffers (e.g.
 * BatchNorm's running statistics) under "model.<key>" (PyTorch's state_dict
 * keys, e.g. "model.0.weight", "model.1.running_mean"), optimizer state under
 * "optim.<key>", and metadata (epoch, step, RNG state, scheduler step, best
 * metric, plus caller-supplied entries such as the model's configuration).
 * It is written atomically, so an interrupted save never leaves a partial
 * file. Resuming restores all of it, so a resumed run continues exactly
 * where the saved one stopped (data order is a function of seed and epoch;
 * in the Learner's iteration mode, of the batch source's (split, iteration,
 * batch number)).
 */
#ifndef EMBER_TRAIN_H
#define EMBER_TRAIN_H

#include "ember/data.h"
#include "ember/nn.h"
#include "ember/optim.h"
#include "ember/store.h"

#include <signal.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/** What a checkpoint records besides tensors. */
typedef struct em_checkpoint_info {
    int64_t epoch;        /**< epochs completed (0 in iteration mode)   */
    int64_t step;         /**< optimizer steps completed (iteration mode: the iterations) */
    double best_metric;   /**< best monitored validation metric so far  */
    int64_t best_epoch;   /**< epoch (1-based) that reached best_metric; iteration mode: its iteration */
    int64_t bad_epochs;   /**< epochs (iteration mode: evaluations) without improvement (early stopping) */
    uint64_t rng_seed, rng_offset; /**< global generator (em_rng_get_state) */
} em_checkpoint_info;

/** Saves model (+ optimizer and scheduler when non-NULL) atomically to @p path.
 *  @p meta adds caller metadata (e.g. "ember.model" = "mlp:784-256-128-10"). */
EM_API em_status em_checkpoint_save(const char *path, const em_module *model, const em_optim *opt,
                                    const em_lr_scheduler *sched, const em_checkpoint_info *info,
                                    const em_st_kv *meta, size_t n_meta);
/** Loads a checkpoint into model (and opt/sched when non-NULL) and fills info.
 *  Everything is validated before anything changes: a file that is not a
 *  valid SafeTensors checkpoint (em_safetensors_open's errors), malformed
 *  progress metadata (EM_ERR_FORMAT naming the key, e.g. 'ember.epoch' not an
 *  integer; a missing key keeps its default of 0), a missing or extra model
 *  key, a shape or dtype mismatch (a checkpoint of another model), an
 *  optimizer of another kind or parameter count, or an optimizer state tensor
 *  that does not fit (tried first on a scratch optimizer over the same
 *  parameters) is an error naming the file and key, and the model, optimizer,
 *  scheduler and info are left untouched. Only a runtime failure while
 *  copying (out of memory, a device error) can leave a partial load. */
EM_API em_status em_checkpoint_load(const char *path, em_module *model, em_optim *opt, em_lr_scheduler *sched,
                                    em_checkpoint_info *info);

/** Per-epoch metrics. Validation fields are NAN when there is no validation set. */
typedef struct em_epoch_metrics {
    int64_t epoch;          /**< 1-based */
    double train_loss, train_accuracy;
    double val_loss, val_accuracy, val_top5;
    double lr;              /**< learning rate this epoch's optimizer steps used (a scheduler
                                 stepped per batch: the epoch's last step's) */
    double samples_per_s;   /**< training samples per second            */
    double epoch_time_s;    /**< wall time of the train + validation phases */
    /* iteration mode (em_learner_config.max_iters > 0); epoch mode: iter 0, the others NAN */
    int64_t iter;           /**< iterations (optimizer steps) done at this evaluation, 0 .. max_iters */
    double tokens_per_s;    /**< training targets per second over the iterations since the last
                                 evaluation (elements of y: B x T for a language model); NAN at 0 */
    double elapsed_s;       /**< wall time since the run (or the resumed run) started */
} em_epoch_metrics;

/** Which part of the data a batch source is asked for (iteration mode). */
typedef enum em_batch_split {
    EM_BATCH_TRAIN = 0, /**< a training batch                 */
    EM_BATCH_VAL = 1,   /**< a validation (evaluation) batch  */
} em_batch_split;

/** Iteration mode's batch source (em_learner_config.batch_source): makes
 *  batch @p k of @p split for iteration @p iter and returns its inputs and
 *  targets as new tensors in *@p x and *@p y (tensor.h rules: the Learner
 *  calls it inside the step's scope, which then owns them). Training: @p iter
 *  is the 0-based iteration the batch is for and @p k is 0; validation:
 *  @p iter is the number of iterations done at that evaluation and @p k runs
 *  over 0 .. eval_iters - 1. The batch must be a pure function of (split,
 *  iter, k) and the source's own settings (e.g. a seed): that is what makes
 *  --resume continue exactly without saving any data-loader state.
 *  x is whatever the model's forward takes (token ids [B, T] for a GPT); y
 *  the integer class targets of the logits: for logits [N, C], y [N]; for
 *  logits [..., C] of rank > 2 (a language model's [B, T, V]), y of the
 *  leading shape ([B, T]): both are flattened to [B*T, V] / [B*T]. Return
 *  EM_OK, or an error status with em_last_error set (training stops with
 *  it). Called on the Learner's thread. */
typedef em_status (*em_batch_source_fn)(em_batch_split split, int64_t iter, int64_t k, em_tensor **x, em_tensor **y,
                                        void *ctx);

/** Training precision (em_learner_config.precision). */
typedef enum em_precision {
    EM_PRECISION_F32 = 0, /**< everything in float32 (the default)                                  */
    EM_PRECISION_TF32,    /**< float32, matmuls allowed TF32 (em_set_float32_matmul_precision HIGH) */
    EM_PRECISION_BF16,    /**< autocast(bf16) around forward and loss; no loss scaling              */
    EM_PRECISION_F16,     /**< autocast(f16) around forward and loss, dynamic loss scaling          */
    EM_PRECISION_COUNT
} em_precision;

/** "f32", "tf32", "bf16", "f16"; NULL for a value outside the enum. */
EM_API const char *em_precision_name(em_precision p);
/** Parses a precision name: "f32" (also "fp32", "float32"), "tf32", "bf16"
 *  ("bfloat16"), "f16" ("fp16", "float16", "half"); case-sensitive. NULL or
 *  another string -> EM_ERR_INVALID naming it and the accepted names, *out
 *  untouched. */
EM_API em_status em_precision_parse(const char *s, em_precision *out);

typedef struct em_learner_config {
    int64_t epochs;           /**< total epochs (default 10)                                */
    const char *out_dir;      /**< checkpoints + metrics.csv go here; NULL = none           */
    const char *resume;       /**< checkpoint to resume from; NULL = fresh start           */
    /** Progress bar: 1 always, 0 never (the epoch lines only), -1 (default)
     *  when @p log is a terminal. One line redrawn with '\r', at most the
     *  terminal's width - 1 columns (TIOCGWINSZ on @p log, else $COLUMNS,
     *  else 80), blanked before each epoch line. */
    int progress;
    int64_t early_stopping_patience; /**< stop after this many epochs without improvement; 0 = off */
    int64_t stop_after_epoch; /**< > 0: return after this epoch as if interrupted (schedules still span `epochs`) */
    bool monitor_loss;        /**< monitor val loss (lower is better) instead of val accuracy */
    double clip_grad_norm;    /**< > 0: clip by global norm                                   */
    em_cross_entropy_opts loss; /**< cross-entropy options (label smoothing, ...)           */
    bool sched_per_step;      /**< step the scheduler every batch (default: every epoch)     */
    const em_st_kv *meta;     /**< extra checkpoint metadata (model configuration)           */
    size_t n_meta;
    FILE *log;                /**< where progress goes (default stdout)                       */
    /** Called once per completed epoch, after its metrics.csv row and
     *  checkpoints are written (rank 0 only), with that epoch's metrics
     *  (valid during the call). Cannot stop training. NULL: none. */
    void (*on_epoch)(const em_epoch_metrics *m, void *ctx);
    void *on_epoch_ctx;       /**< passed to on_epoch                                         */
    /** Graceful stop (e.g. Ctrl-C): when non-NULL, em_learner_fit reads
     *  *stop_flag between steps (training and validation); once it is
     *  non-zero it abandons the rest of the epoch, writes nothing for it
     *  (the files of the last finished epoch stay as they are: no
     *  half-epoch checkpoint) and returns EM_ERR_INTERRUPTED with a message
     *  naming the epoch and the last checkpoint. The library never installs
     *  signal handlers: the program does (sigaction) and points this at the
     *  volatile sig_atomic_t its async-signal-safe handler sets. BORROWED.
     *  [dist] Not read with more than one rank (the ranks would have to
     *  agree on the step; `ember train` under mpirun leaves signals to
     *  mpirun). NULL (default): never stops early. */
    volatile sig_atomic_t *stop_flag;
    /** [dist] One process, several devices: data-parallel replicas
     *  (em_replicas_new; BORROWED). The model and optimizer passed to
     *  em_learner_fit must then be replica 0's. Every batch is split into
     *  contiguous shares, one per replica (sizes differ by at most one); each
     *  replica's loss is weighted by its share so the averaged gradient is
     *  that of the whole batch; validation is split the same way.
     *  Checkpoints hold replica 0; resuming loads it and copies it to the
     *  others. NULL: the model alone. */
    struct em_replicas *replicas;
    /** Precision of the training and validation steps (include/ember/amp.h):
     *  BF16 / F16 run each step's forward and loss inside an autocast region
     *  of that dtype (matmul and conv low; softmax, the loss, reductions and
     *  norms f32) opened on the step's thread; backward and the optimizer
     *  run outside it. The model stays f32: its parameters are the master
     *  weights and the optimizer's state is f32, as torch.autocast. F16
     *  also scales the loss with an em_grad_scaler (PyTorch's defaults: init
     *  scale 65536, growth 2 every 2000 clean steps, back-off 0.5): the
     *  gradients are unscaled (before clipping), a step whose gradients hold
     *  an inf or a NaN is skipped (the step counter and a per-step scheduler
     *  still advance, as a PyTorch loop's), and the scaler's state (scale,
     *  growth tracker) is saved in the checkpoint's metadata
     *  ("ember.grad_scaler.scale", "ember.grad_scaler.growth_tracker") and
     *  restored on resume, so a resumed run continues exactly; a checkpoint
     *  without it starts a fresh scaler. F16 with replicas: EM_ERR_UNSUPPORTED.
     *  TF32: em_set_float32_matmul_precision(EM_MATMUL_HIGH) for the fit
     *  (f32 matmuls and convolutions on CUDA's TF32 tensor cores; the CPU
     *  and OpenCL compute f32 as always), the previous setting restored
     *  when it returns. Default EM_PRECISION_F32. */
    em_precision precision;
    /* ---- iteration mode -------------------------------------------------------
     * max_iters > 0 trains for that many iterations (optimizer steps) on
     * batches from batch_source instead of epochs over loaders, as nanoGPT's
     * loop: the train and val loaders of em_learner_fit are not used (pass
     * NULL), epochs and sched_per_step are ignored, the scheduler (if any) is
     * stepped after every iteration (iteration i runs at lr_at(i)). An
     * evaluation (eval_iters validation batches, no-grad, eval mode) runs at
     * iteration 0, every eval_interval iterations and at max_iters; each one
     * prints a row of a table under a header printed once ("iter I/N",
     * train_loss = the mean loss of the iterations since the previous
     * evaluation (nan at 0), val_loss = the mean of the eval_iters batch
     * losses, lr = the last iteration's, tokens/s = training targets per
     * second since the previous evaluation, elapsed = wall time since start),
     * appends a row "iter,train_loss,val_loss,lr,tokens_per_s,elapsed_s" to
     * out_dir/metrics.csv, saves out_dir/best.safetensors when val_loss
     * improved (train_loss when eval_iters is 0) and
     * out_dir/checkpoint.safetensors (the checkpoint's step = iterations done,
     * best_epoch = the best evaluation's iteration, epoch 0), then calls
     * on_epoch. Between evaluations the loss stays on the device: no host
     * read per step (the progress bar, when on, reads it about 20 times per
     * interval), and gradient clipping uses em_clip_grad_norm_tensor.
     * early_stopping_patience counts evaluations without improvement. The
     * metrics carry no accuracy (NAN). Ctrl-C (stop_flag): the iterations
     * since the last evaluation are dropped, nothing is written, and
     * EM_ERR_INTERRUPTED names the iteration and the last checkpoint.
     * Resume: the checkpoint's iteration, optimizer, scheduler and RNG state
     * are restored and the batches are the source's pure function of the
     * iteration, so a resumed run is byte-identical to an uninterrupted one.
     * Not with replicas or several ranks yet (EM_ERR_UNSUPPORTED). */
    int64_t max_iters;        /**< > 0: iteration mode with this many iterations; 0 (default): epochs */
    int64_t eval_interval;    /**< iterations between evaluations; 0 (default): only at 0 and at the end */
    int64_t eval_iters;       /**< validation batches per evaluation (default 100, the anchor's); 0: none */
    int64_t stop_after_iter;  /**< > 0: evaluate, save and return after this iteration as if
                                   interrupted (the schedule still spans max_iters), an extra
                                   evaluation when it is not an evaluation iteration */
    em_batch_source_fn batch_source; /**< iteration mode's batches (required then); see em_batch_source_fn */
    void *batch_source_ctx;   /**< passed to batch_source (BORROWED) */
} em_learner_config;

EM_API em_learner_config em_learner_config_default(void);

/** Trains @p model with cross-entropy on @p train (and evaluates on @p val
 *  when non-NULL) for cfg->epochs epochs, or, with cfg->max_iters > 0, for
 *  that many iterations on cfg->batch_source's batches (iteration mode: see
 *  the config's fields; @p train and @p val are then unused and may be
 *  NULL): per epoch it prints one row of a
 *  table of metrics under a header printed once (columns train_loss,
 *  train_acc, val_loss, val_acc, val_top5, lr, samples/s, time; each row
 *  starts "epoch E/N" and is 91 columns wide for N < 100), saves
 *  out_dir/best.safetensors on improvement, then out_dir/checkpoint.safetensors
 *  (both atomically: a temporary file, then a rename), and only then appends
 *  the epoch's row to out_dir/metrics.csv, so the file never holds a row of
 *  an epoch its checkpoint does not contain. Writes up to @p max_history
 *  entries into @p history and their count into @p n_history (both may be
 *  NULL).
 *
 *  out_dir is created when missing. Existing run files in it are NOT checked
 *  here (the caller decides: em_run_dir_holds_run, em_run_dir_clear); a
 *  fresh run appends to an existing metrics.csv. At start, stale temporary
 *  files of Ember's own run-file writes (em_run_dir_remove_stale_tmp) are
 *  removed. With cfg->resume, rows of metrics.csv of epochs after the
 *  checkpoint's epoch (left by a run stopped or killed after it) are dropped
 *  (the file is rewritten atomically) before training continues.
 *
 *  cfg->precision picks the precision of the steps (see the field).
 *
 *  Step capture (DESIGN.md §6, em_capture_begin in ember/core.h): in epoch
 *  mode with one model, one rank and no f16 loss scaling, each
 *  training epoch runs its first step eagerly, captures its second and
 *  replays it for every later batch of that size (a batch of another size
 *  runs eagerly). Results are those of eager steps. EMBER_CAPTURE=0, a
 *  refused capture (its reason at EMBER_LOG=debug) and iteration mode train
 *  eagerly.
 *
 *  Errors: the status of what failed (loading the checkpoint, a write, a
 *  kernel, the batch source); EM_ERR_INTERRUPTED when cfg->stop_flag was
 *  raised; a precision outside the enum, iteration mode without a
 *  batch_source, a negative max_iters / eval_interval / eval_iters /
 *  stop_after_iter -> EM_ERR_INVALID; iteration mode with replicas or
 *  several ranks -> EM_ERR_UNSUPPORTED; a malformed grad-scaler entry in the
 *  resumed checkpoint -> EM_ERR_FORMAT naming it. */
EM_API em_status em_learner_fit(em_module *model, em_optim *opt, em_lr_scheduler *sched, em_loader *train,
                                em_loader *val, const em_learner_config *cfg, em_epoch_metrics *history,
                                int max_history, int *n_history);

/* ---- run folders ------------------------------------------------------------------ */

/** Names of the files a run writes into its folder, NULL-terminated:
 *  checkpoint.safetensors, best.safetensors, metrics.csv and the plots
 *  loss.png, accuracy.png, loss.svg, accuracy.svg. Static storage. */
EM_API const char *const *em_run_files(void);
/** True when @p dir holds a run: any of em_run_files() exists in it (a
 *  missing @p dir holds none). @p found (may be NULL) receives the first such
 *  file's name, truncated to @p nfound bytes. */
EM_API bool em_run_dir_holds_run(const char *dir, char *found, size_t nfound);
/** Removes the run files of @p dir and Ember's stale temporaries of them
 *  (--overwrite); anything else in the folder is left alone, and so is the
 *  folder. A missing @p dir is not an error. Returns the number of files
 *  removed, or a negative em_status (EM_ERR_IO naming the file). */
EM_API int em_run_dir_clear(const char *dir);
/** Removes the temporary files Ember's atomic writes of the run files leave
 *  when killed mid-write: exactly "<run file>.tmp.XXXXXX" (mkstemp's six
 *  letters or digits, e.g. "checkpoint.safetensors.tmp.a1B2c3"), regular
 *  files only; nothing else is touched. Prints each removal to @p log when
 *  non-NULL. Returns the number removed, or a negative em_status. Not safe
 *  while another process writes into the same folder. */
EM_API int em_run_dir_remove_stale_tmp(const char *dir, FILE *log);
/** Claims @p dir for one run: creates it (mkdir -p) and takes an exclusive
 *  advisory lock (flock) on DIR/.ember-lock, in which it writes this
 *  process's pid. The lock lasts until the returned file descriptor is closed
 *  or the process ends (also when killed: nothing stale is left to clean);
 *  keep it open for the whole run. Two runs started at the same moment can
 *  then never pick the same folder. Returns the descriptor (>= 0), or -1 with
 *  EM_ERR_STATE when another process holds the lock (the message names the
 *  folder and that process's pid) and EM_ERR_IO when the folder or the lock
 *  file cannot be made. Needs no runtime. */
EM_API int em_run_dir_lock(const char *dir);

/** Checks, before a run starts, that @p dir (a run's output directory, e.g.
 *  the final folder chosen for --out) can receive its files, and leaves
 *  nothing behind: when @p dir exists it must be a directory in which a file
 *  can be created (a probe file is created and removed at once); when it does
 *  not, its nearest existing ancestor must be a directory in which it can be
 *  created (probed the same way; @p dir itself is not created). A probe sees
 *  what a real write would see (read-only file systems, ACLs, root's
 *  permissions). Errors: EM_ERR_INVALID (NULL, empty or longer than 4095
 *  bytes), EM_ERR_IO with a message naming @p dir and the reason, e.g.
 *  "output directory runs/x is not writable (cannot create a file in it:
 *  Permission denied)" or "cannot create output directory f/x: f is not a
 *  directory". Needs no runtime (callable before em_init). */
EM_API em_status em_check_output_dir(const char *dir);

/** Evaluation results. */
typedef struct em_eval_result {
    double loss, accuracy, top5;
    int64_t samples;
} em_eval_result;

/** Evaluates under no-grad in eval mode. @p confusion, when non-NULL, receives
 *  a num_classes x num_classes matrix (row = true class, column = predicted). */
EM_API em_status em_evaluate(em_module *model, em_loader *data, int64_t num_classes, em_eval_result *out,
                             int64_t *confusion);

#ifdef __cplusplus
}
#endif
#endif
