/* Ember core: status codes, dtypes, devices, runtime lifecycle, errors, logging.
 *
 * Every public function returns NULL or a negative em_status on failure and
 * records a human-readable message that em_last_error() returns (thread-local).
 */
#ifndef EMBER_CORE_H
#define EMBER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EM_API __attribute__((visibility("default")))
#else
#define EM_API
#endif

#define EMBER_VERSION_MAJOR 0
#define EMBER_VERSION_MINOR 1
#define EMBER_VERSION_PATCH 0
#define EMBER_VERSION_STRING "0.1.0"

/** Maximum tensor rank. */
#define EM_MAX_DIMS 8

/** Status codes: 0 is success, failures are negative. Append-only. */
typedef enum em_status {
    EM_OK = 0,
    EM_ERR_INVALID = -1,  /**< bad argument (NULL, bad axis, bad option)     */
    EM_ERR_SHAPE = -2,    /**< shapes do not match / cannot broadcast         */
    EM_ERR_DTYPE = -3,    /**< unsupported or mismatched dtype                */
    EM_ERR_NOMEM = -4,    /**< allocation failed                              */
    EM_ERR_IO = -5,       /**< file could not be opened/read/written          */
    EM_ERR_FORMAT = -6,   /**< corrupt or unexpected file content             */
    EM_ERR_DEVICE = -7,   /**< device missing or unusable                     */
    EM_ERR_RUNTIME = -8,  /**< StarPU / runtime failure                       */
    EM_ERR_STATE = -9,    /**< call not valid in the current state            */
    EM_ERR_UNSUPPORTED = -10, /**< not implemented for this input/device      */
    EM_ERR_INTERRUPTED = -11, /**< stopped on request (em_learner_config.stop_flag, e.g. Ctrl-C) */
} em_status;

/** Element types. EM_F16 is IEEE 754 binary16, EM_BF16 bfloat16 (8-bit
 *  exponent, 7-bit mantissa): storage types, 2 bytes per element; every op
 *  loads them, computes in f32 and stores them (DESIGN.md §7), reductions
 *  accumulate in f32. Casts round to nearest even (devices/half.h). Type
 *  promotion follows PyTorch: a float dtype beats integers, f16 with bf16
 *  gives f32. */
typedef enum em_dtype {
    EM_F32 = 0,
    EM_F64 = 1,
    EM_I32 = 2,
    EM_I64 = 3,
    EM_U8 = 4,
    EM_BOOL = 5,
    EM_F16 = 6,
    EM_BF16 = 7,
    EM_DTYPE_COUNT
} em_dtype;

/** Size in bytes of one element of @p dt (0 for an invalid dtype). */
EM_API size_t em_dtype_size(em_dtype dt);
/** Lower-case name ("float32", "int64", "bool", ...) as PyTorch prints it. */
EM_API const char *em_dtype_name(em_dtype dt);
/** true for f32/f64/f16/bf16. */
EM_API bool em_dtype_is_float(em_dtype dt);

/** Device kinds; EM_DEVICE_AUTO lets StarPU's performance-model scheduler choose. */
typedef enum em_device_kind {
    EM_DEVICE_CPU = 0,
    EM_DEVICE_CUDA = 1,
    EM_DEVICE_OPENCL = 2,
    EM_DEVICE_HIP = 3,
    EM_DEVICE_AUTO = 4,
} em_device_kind;

/** Where ops may run. index selects the device within its kind (ignored for CPU/AUTO). */
typedef struct em_device {
    em_device_kind kind;
    int index;
} em_device;

EM_API em_device em_device_cpu(void);
EM_API em_device em_device_cuda(int index);
EM_API em_device em_device_opencl(int index);
EM_API em_device em_device_auto(void);
/** Parses "cpu", "cuda", "cuda:1", "opencl:0", "auto". Returns EM_ERR_INVALID on junk. */
EM_API em_status em_device_parse(const char *s, em_device *out);
/** Writes "cpu", "cuda:0", ... into buf. */
EM_API const char *em_device_str(em_device d, char *buf, size_t n);
/** Sets the device used by ops submitted from now on: the process's device
 *  (all threads), or the calling thread's own device when it has one
 *  (em_set_thread_device). Fails with EM_ERR_DEVICE (message names the
 *  device) when no worker of that device exists. */
EM_API em_status em_set_device(em_device d);
/** The device ops submitted by the calling thread go to: its own device when
 *  set, else the process's. */
EM_API em_device em_get_device(void);
/** Gives the calling thread its own device, overriding the process's device
 *  for the ops it submits (as torch.cuda.set_device, which is per thread),
 *  until em_clear_thread_device. Used by threads that drive one replica each
 *  (em_replicas_run). Errors as em_set_device. */
EM_API em_status em_set_thread_device(em_device d);
/** The calling thread follows the process's device again. */
EM_API void em_clear_thread_device(void);

/** Log levels for em_log. */
typedef enum em_log_level {
    EM_LOG_ERROR = 0,
    EM_LOG_WARN = 1,
    EM_LOG_INFO = 2,
    EM_LOG_DEBUG = 3,
} em_log_level;

/** Runtime configuration. Zero-initialise with em_config_default(); every
 *  field can be overridden by the environment (named in brackets). */
typedef struct em_config {
    int ncpus;             /**< CPU workers; -1 = all cores but one when >2 [EMBER_NCPU] */
    int ncuda;             /**< CUDA workers; -1 = all GPUs [EMBER_NCUDA]                */
    int nopencl;           /**< OpenCL devices; -1 = StarPU default, 0 = none [EMBER_NOPENCL] */
    const char *sched;     /**< StarPU scheduler; NULL = "lws" (CPU) / "dmda" (auto) [EMBER_SCHED] */
    const char *device;    /**< default device string; NULL = "cpu" [EMBER_DEVICE]        */
    em_log_level log_level;/**< [EMBER_LOG=error|warn|info|debug]                          */
    bool starpu_verbose;   /**< let StarPU print its banner and warnings [EMBER_STARPU_VERBOSE] */
} em_config;

EM_API em_config em_config_default(void);

/** Starts StarPU (and hwloc) with @p cfg (NULL = defaults + environment).
 *  Calling it twice without em_shutdown is an EM_ERR_STATE error.
 *  StarPU's performance-model directory ($STARPU_PERF_MODEL_DIR, else
 *  $STARPU_HOME/.starpu/sampling, else $HOME/.starpu/sampling) is checked
 *  first: an unwritable $HOME falls back to $TMPDIR/ember-starpu-UID (or
 *  /tmp/...) with a warning, and sets STARPU_HOME to it; an unwritable
 *  directory named by a STARPU_ variable is an EM_ERR_IO error naming it. */
EM_API em_status em_init(const em_config *cfg);
/** Waits for all submitted tasks, releases pooled handles and stops StarPU. */
EM_API void em_shutdown(void);
EM_API bool em_is_initialized(void);
/** Blocks until every submitted task has finished. A kernel that failed on
 *  its device since the last report (CUDA/OpenCL error, cuBLAS status, device
 *  out of memory) is returned here, or by the next em_to_host / em_item /
 *  em_tensor_print, whichever comes first: its status and a message naming
 *  the op, the device and the operand shapes (em_last_error). The report
 *  clears it and the program can go on; the failed op's outputs (and what
 *  was computed from them) are undefined. Process-wide: the first failure
 *  is kept, later ones until the report are only counted. */
EM_API em_status em_sync(void);

/** Precision of float32 matrix products and convolutions, as PyTorch's
 *  torch.set_float32_matmul_precision ("highest" / "high"). */
typedef enum em_matmul_precision {
    EM_MATMUL_HIGHEST = 0, /**< full FP32 arithmetic (the default)                        */
    EM_MATMUL_HIGH = 1,    /**< TF32 tensor cores where a device has them: inputs rounded to
                                a 10-bit mantissa, products accumulated in f32             */
} em_matmul_precision;

/** Sets how float32 em_matmul (and everything built on it: linear layers,
 *  attention) and float32 convolutions run on CUDA devices: EM_MATMUL_HIGH
 *  lets cuBLAS use TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH) and cuDNN
 *  CUDNN_TENSOR_OP_MATH; EM_MATMUL_HIGHEST (the default) keeps full FP32
 *  (CUBLAS_DEFAULT_MATH, CUDNN_FMA_MATH). Operands keep their shapes and
 *  dtypes (f32 in, f32 out); only the rounding of the products changes
 *  (relative error about 1e-3 instead of 1e-6 per product). f64, f16, bf16
 *  and integer products, and the CPU and OpenCL kernels, are not affected.
 *  Process-wide; may be called before em_init and at any time after. A
 *  kernel reads the setting when it starts on its device, so ops submitted
 *  but not yet started when it changes may run under either setting: call
 *  em_sync first for an exact switch. EMBER_TF32=1 in the environment sets
 *  EM_MATMUL_HIGH at em_init (any other value of it: EM_MATMUL_HIGHEST;
 *  unset: the setting is left as it is). A value other than the two is
 *  refused: the setting is unchanged and EM_ERR_INVALID becomes the calling
 *  thread's last error (em_last_status). */
EM_API void em_set_float32_matmul_precision(em_matmul_precision p);
/** The current setting of em_set_float32_matmul_precision (EM_MATMUL_HIGHEST
 *  until changed). Never fails. */
EM_API em_matmul_precision em_get_float32_matmul_precision(void);

/** Number of StarPU workers of each kind. */
EM_API int em_worker_count(em_device_kind kind);
/** Parses a comma-separated device list ("cuda:0,cuda:1", "cpu,opencl:0")
 *  into @p out (at most @p max entries) and its length into @p *n.
 *  "cuda:all" (any kind) stands for every device of that kind this process
 *  drives, so it needs the runtime up (EM_ERR_STATE before em_init;
 *  EM_ERR_DEVICE when there is none). Bad syntax: EM_ERR_INVALID naming the
 *  entry. Does not check that listed devices exist (em_set_device does). */
EM_API em_status em_devices_parse(const char *list, em_device *out, int max, int *n);
/** Number of devices of @p kind this process drives (cuda:0 .. cuda:N-1):
 *  distinct devices, whatever the workers per device; 1 for cpu and auto
 *  when the runtime is up, 0 before em_init. */
EM_API int em_device_count(em_device_kind kind);
/** Stops the workers from polling for tasks (starpu_pause): StarPU's CPU
 *  workers otherwise spin while idle and keep every core they own busy. A
 *  process that waits for outside events between bursts of work (`ember
 *  serve` between requests) calls this when it goes idle and
 *  em_resume_workers before it submits again; tasks submitted in between
 *  wait until then. Pair every call with one em_resume_workers. No-ops before
 *  em_init. */
EM_API void em_pause_workers(void);
/** Undoes one em_pause_workers. */
EM_API void em_resume_workers(void);
/** Prints workers, devices, memory nodes and the hwloc topology summary. */
EM_API void em_print_devices(FILE *f);

/** Last error message of the calling thread ("" when none). */
EM_API const char *em_last_error(void);
/** Last error status of the calling thread (EM_OK when none). */
EM_API em_status em_last_status(void);
/** Clears the calling thread's last error (em_last_status() is then EM_OK). */
EM_API void em_clear_error(void);
/** Records @p st and a printf-style message as the calling thread's last
 *  error (what em_last_error / em_last_status return) and returns @p st.
 *  For code that extends Ember through its callbacks (a dataset's get, see
 *  ember/data.h): report a failure the way Ember's own functions do, e.g.
 *  `return em_set_error(EM_ERR_IO, "%s: short read", path);`. The message is
 *  truncated to 1023 bytes. */
EM_API em_status em_set_error(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
EM_API const char *em_status_str(em_status s);

EM_API void em_set_log_level(em_log_level lvl);
EM_API em_log_level em_get_log_level(void);
EM_API void em_log_msg(em_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Live-object counters, for leak checks. */
typedef struct em_stats {
    int64_t live_tensors;   /**< em_tensor objects alive                          */
    int64_t live_storages;  /**< storages referenced by at least one tensor       */
    int64_t handles;        /**< StarPU handles registered by Ember (incl. pooled)*/
    int64_t pooled;         /**< handles waiting in the reuse pool                */
    int64_t tasks_submitted;/**< StarPU tasks submitted since em_init             */
    int64_t ops_fused;      /**< element-wise ops run inside fused tasks          */
    int64_t fused_tasks;    /**< fused tasks submitted (each runs >= 2 ops)        */
} em_stats;
/** The counters, since the process started (tasks_submitted: since
 *  em_init). Submits the element-wise ops the fusion stream holds first,
 *  so the counts include them. */
EM_API em_stats em_get_stats(void);

/** Element-wise fusion (DESIGN.md §6). When on (the default; the environment
 *  variable EMBER_FUSION=0 read by em_init makes off the default), element-wise
 *  ops of the table (unary, tensor-scalar and binary math ops, not the
 *  comparisons) whose operands are all float32 or all float64 and of one
 *  shape are held in a lazy stream and run as one task per chain, with one
 *  generated program; a chain ends at the next other op, host read
 *  (em_to_host, em_item), em_sync, em_get_stats, after 32 ops or 12 distinct
 *  inputs. An intermediate that no tensor references any more when its chain
 *  runs is never written to memory. Results equal those of the ops run one
 *  by one (the same expressions in the same precision); errors of a chain's
 *  task are reported like any op's (the next em_sync or host read).
 *  em_set_fusion submits what is held, sets the mode (process-wide) and
 *  returns the previous one. Thread-safe. */
EM_API bool em_set_fusion(bool on);
/** Whether element-wise fusion is on (em_set_fusion). */
EM_API bool em_fusion_enabled(void);

/** Step capture (DESIGN.md §6): record the tasks of one training (or
 *  inference) step once, then replay them as ONE task per step, whose kernel
 *  runs the recorded kernels in order — on a CUDA worker as CUDA graphs — with
 *  no per-op front-end work, allocation or handle registration.
 *
 *  em_capture_begin starts recording what the calling thread submits; the
 *  step then runs eagerly, as usual, and em_capture_end returns it as an
 *  em_step (owned by the caller: em_step_free). Every replay reuses the
 *  recording's tensors: to feed a new batch, copy it into the input tensors
 *  the step was captured with (em_copy_) before em_step_replay, and read the
 *  results from the tensors the step wrote (the loss, the parameters). The
 *  optimizers' step counts and learning rates and the random ops' streams
 *  (dropout) advance per replay as they would eagerly; the optimizer must
 *  outlive the step. A change of shape, dtype, device or model needs a new
 *  capture (the caller's: the step replays what it recorded).
 *
 *  em_capture_end fails (NULL, EM_ERR_UNSUPPORTED naming the reason) for a
 *  step that cannot be replayed: it read a tensor on the host (em_to_host,
 *  em_item), it holds data-parallel collectives or step fences, an op ran on
 *  another device, its random draws cannot be advanced (fused attention's
 *  dropout), it submitted nothing — and when capture is off (the environment
 *  variable EMBER_CAPTURE=0, em_capture_enabled). The step's eager run has
 *  happened either way: a caller falls back to running the step eagerly.
 *  EM_ERR_STATE: not initialized, or already capturing on this thread. */
typedef struct em_step em_step;
EM_API em_status em_capture_begin(void);
EM_API em_step *em_capture_end(void);
/** Submits one replay of @p step (asynchronous, like any op). EM_ERR_STATE
 *  while the calling thread captures. */
EM_API em_status em_step_replay(em_step *step);
/** The number of tasks @p step recorded (-1 for NULL). */
EM_API int64_t em_step_task_count(const em_step *step);
/** Waits for the step's replays, then frees it and releases its tensors. */
EM_API void em_step_free(em_step *step);
/** false when EMBER_CAPTURE=0 (em_capture_end then refuses every step). */
EM_API bool em_capture_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
