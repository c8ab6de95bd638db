/* Ember data: datasets (in-memory arrays, IDX/MNIST, CSV) and the DataLoader.
 *
 * A dataset is a random-access list of samples; sample i is a vector of
 * float features (num_features = product of the feature shape) and one int64
 * label. Everything here lives in host memory; a batch becomes tensors only
 * when asked (em_batch_to_tensors).
 *
 * Errors: functions return NULL or a negative em_status and record a message
 * for em_last_error() that names the file, line or index and what is wrong.
 *
 * Threads: em_dataset_get() may be called from several threads at once (the
 * loader's workers do); the built-in datasets are read-only after opening.
 * A loader is used from one thread (its workers are internal).
 */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets --------------------------------------------------------------- */

typedef struct em_dataset em_dataset;

/** Operations of a dataset. To write a dataset of your own, embed an
 *  em_dataset as the FIRST member of your struct, fill it with
 *  em_dataset_init() and return a pointer to it. */
typedef struct em_dataset_vtable {
    /** Number of samples. */
    int64_t (*length)(const em_dataset *ds);
    /** Writes sample @p index (0 <= index < length): num_features floats into
     *  @p x and its label into @p *y. Must be safe to call concurrently.
     *  Returns EM_OK or a negative status and sets the message with em_set_error
     *  (ember/core.h), e.g. em_set_error(EM_ERR_IO, "sample %lld: ...", ...). */
    em_status (*get)(const em_dataset *ds, int64_t index, float *x, int64_t *y);
    /** Releases everything the dataset owns, including @p ds itself. */
    void (*free)(em_dataset *ds);
} em_dataset_vtable;

/** Common header of every dataset. Read-only for users. */
struct em_dataset {
    const em_dataset_vtable *vt;
    int feature_ndim;                          /**< rank of one sample, <= EM_MAX_DIMS - 1 */
    int64_t feature_shape[EM_MAX_DIMS];        /**< shape of one sample                   */
    int64_t num_features;                      /**< product of feature_shape              */
    int64_t num_classes;                       /**< max label + 1, or 0 when unknown      */
};

/** Fills the header of a user dataset. feature_ndim in [0, EM_MAX_DIMS-1],
 *  sizes >= 1. Returns EM_ERR_INVALID on bad arguments. */
EM_API em_status em_dataset_init(em_dataset *ds, const em_dataset_vtable *vt,
                                 const int64_t *feature_shape, int feature_ndim,
                                 int64_t num_classes);
/** Number of samples (-1 and an error for NULL). */
EM_API int64_t em_dataset_length(const em_dataset *ds);
/** Floats per sample (-1 and an error for NULL). */
EM_API int64_t em_dataset_num_features(const em_dataset *ds);
/** Sample @p index into caller buffers: @p x holds num_features floats, @p y one
 *  int64. EM_ERR_INVALID for a NULL argument or an index out of range. */
EM_API em_status em_dataset_get(const em_dataset *ds, int64_t index, float *x, int64_t *y);
/** Frees the dataset (NULL is a no-op). */
EM_API void em_dataset_free(em_dataset *ds);

/** In-memory dataset: copies @p n samples, @p x is [n, prod(feature_shape)]
 *  float32 row-major and @p y is [n] int64. num_classes = max(y) + 1 (0 when
 *  n == 0 or a label is negative). The caller keeps ownership of x and y. */
EM_API em_dataset *em_dataset_from_arrays(const float *x, const int64_t *y, int64_t n,
                                          const int64_t *feature_shape, int feature_ndim);

/** A view of samples [start, start + count) of @p base (e.g. a validation
 *  split). BORROWS base, which must outlive the subset; freeing the subset
 *  does not free base. */
EM_API em_dataset *em_dataset_subset(em_dataset *base, int64_t start, int64_t count);

/* ---- IDX files (MNIST format) ----------------------------------------------- */

/** IDX element type codes (third byte of the magic number). */
enum {
    EM_IDX_U8 = 0x08,
    EM_IDX_I8 = 0x09,
    EM_IDX_I16 = 0x0B,
    EM_IDX_I32 = 0x0C,
    EM_IDX_F32 = 0x0D,
    EM_IDX_F64 = 0x0E,
};

/** Magic numbers of MNIST's files: u8 images [N, rows, cols], u8 labels [N]. */
#define EM_IDX_MAGIC_IMAGES 0x00000803u
#define EM_IDX_MAGIC_LABELS 0x00000801u

/** Contents of one IDX file. */
typedef struct em_idx {
    uint32_t magic;              /**< as in the file: 0x0000 <type> <ndim>      */
    int type;                    /**< EM_IDX_U8 ...                             */
    size_t elem_size;            /**< bytes per element                         */
    int ndim;                    /**< 1 .. EM_MAX_DIMS                          */
    int64_t dims[EM_MAX_DIMS];   /**< sizes, from the big-endian header         */
    int64_t numel;
    void *data;                  /**< numel elements in HOST byte order, C order; owned, free with em_idx_free */
    size_t nbytes;
} em_idx;

/** Reads an IDX file, plain or gzip-compressed (detected from its content).
 *  @p expected_magic: 0 accepts any valid IDX header, otherwise the magic must
 *  equal it (checked before the data is read). On success fills @p out (free
 *  with em_idx_free). Errors, each naming @p path:
 *  EM_ERR_IO (cannot open), EM_ERR_FORMAT (bad or unexpected magic, unknown
 *  type, rank 0 or > EM_MAX_DIMS, sizes whose product exceeds 2^59 elements
 *  (naming the dimension), truncated header or data, a gzip stream cut
 *  before its end (even when only its CRC trailer is missing) or with a bad
 *  CRC, bytes after the data). A dimension of size 0 gives an empty array.
 *  Memory use is bounded by the data actually present, whatever the header
 *  claims. docs/file-formats.md lists every rule. */
EM_API em_status em_idx_read(const char *path, uint32_t expected_magic, em_idx *out);
/** Frees out->data and zeroes @p idx (NULL is a no-op). */
EM_API void em_idx_free(em_idx *idx);

/** Default directory of the Fashion-MNIST files. */
#define EM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/** Fashion-MNIST mean and std of the pixel values scaled to [0, 1] (training
 *  set), the constants torchvision examples use. */
#define EM_FASHION_MNIST_MEAN 0.2860f
#define EM_FASHION_MNIST_STD 0.3530f
/** MNIST's (LeCun et al.) constants, for the original digits. */
#define EM_MNIST_MEAN 0.1307f
#define EM_MNIST_STD 0.3081f

/** MNIST-format dataset (MNIST, Fashion-MNIST, KMNIST...) from @p dir (NULL =
 *  EM_FASHION_MNIST_DIR): train = true reads train-images-idx3-ubyte and
 *  train-labels-idx1-ubyte, false the t10k-* pair, each with or without
 *  ".gz" (also the "train-images.idx3-ubyte" spelling). Samples have feature
 *  shape [1, rows, cols] (NCHW without N) and values pixel/255 in [0, 1]
 *  (normalise in the loader); labels are 0..255 (0..9 for MNIST).
 *  Errors: EM_ERR_IO when a file is missing, EM_ERR_FORMAT as em_idx_read and
 *  when the image and label counts differ. */
EM_API em_dataset *em_mnist_open(const char *dir, bool train);
/** Same from explicit file paths. */
EM_API em_dataset *em_mnist_open_files(const char *images_path, const char *labels_path);

/* ---- CSV files ---------------------------------------------------------------- */

typedef struct em_csv_options {
    int label_column;   /**< index of the label column; negative counts from the end (-1 = last) */
    bool has_header;    /**< skip the first line (column names)                          */
    char delimiter;     /**< ',' by default                                             */
} em_csv_options;

/** {label_column = -1, has_header = false, delimiter = ','}. */
EM_API em_csv_options em_csv_options_default(void);

/** Reads a CSV file of numbers (all cells parsed with strtod; surrounding
 *  spaces and double quotes are ignored; empty lines are skipped; CRLF ok).
 *  The label column must hold integers; the others become the features
 *  (feature shape [ncols - 1], in column order). @p opt NULL = defaults.
 *  Errors, each naming "path:line": EM_ERR_IO (cannot open / read),
 *  EM_ERR_FORMAT (a row with a different number of cells than the first,
 *  a cell that is not a number, a label that is not an integer, no data rows,
 *  label column out of range). */
EM_API em_dataset *em_csv_open(const char *path, const em_csv_options *opt);

/* ---- DataLoader ----------------------------------------------------------------- */

/** Per-sample image transforms of a loader (torchvision's RandomCrop(size,
 *  padding), RandomHorizontalFlip(p) and Normalize(mean, std), in that order),
 *  applied on the loader threads to each sample of a batch, BEFORE the
 *  loader's own mean/std normalisation (em_loader_options.mean/std).
 *  A sample is an image of channels x height x width floats, C-major (NCHW
 *  without N); 0 for the three sizes takes them from the dataset's feature
 *  shape, which must then be [C, H, W] (or [H, W]: one channel).
 *
 *  Random draws depend only on (loader seed, epoch, sample position): the
 *  position p of the sample in the epoch's (shuffled, unsharded) order, so
 *  a batch is the same with any number of workers, and the same sample gets
 *  the same draws on whichever rank reads it. Per sample, a splitmix64
 *  stream starts at em_image_transform_state(seed, epoch, p); crop offsets
 *  are drawn first (top, then left, each uniform in [0, 2 * crop_padding]),
 *  then the flip (next draw's top 53 bits / 2^53 < hflip_p).
 *
 *  All fields zero (the default of em_loader_options) = no transform. */
typedef struct em_image_transform {
    int64_t channels, height, width; /**< image layout; 0 = from the dataset's feature shape      */
    /** RandomCrop(size = (height, width), padding = crop_padding): pad every
     *  side with crop_padding zeros (fill 0, before normalisation, as
     *  torchvision) and cut a height x width window at a random offset.
     *  0 = off. */
    int64_t crop_padding;
    /** RandomHorizontalFlip(p): mirror left-right with probability hflip_p
     *  (0 = off, torchvision's default 0.5). */
    double hflip_p;
    /** Normalize(mean, std): x' = (x - mean[c]) / std[c] per channel, @p
     *  channels values each (copied by em_loader_new); NULL = none. Both or
     *  neither; std[c] != 0. Not random: eval loaders keep it. */
    const float *mean, *std;
} em_image_transform;

/** The transform without its random parts (crop and flip off, normalisation
 *  kept): what an evaluation loader of a model trained with @p t uses. */
EM_API em_image_transform em_image_transform_eval(em_image_transform t);

/** Start of the splitmix64 stream of the sample at position @p position of
 *  epoch @p epoch (see em_image_transform): a function of its arguments only. */
EM_API uint64_t em_image_transform_state(uint64_t seed, int64_t epoch, int64_t position);

/** Applies @p t (sizes resolved: channels, height, width > 0) to one image
 *  @p x in place, with the random draws of @p state (advanced); @p tmp holds
 *  channels * height * width floats of scratch space. What the loader calls
 *  per sample; exposed for tests and custom pipelines. */
EM_API em_status em_image_transform_apply(const em_image_transform *t, float *x, float *tmp, uint64_t *state);

typedef struct em_loader_options {
    int64_t batch_size;   /**< samples per batch, >= 1 (default 32)                      */
    bool shuffle;         /**< new permutation each epoch (default false)                 */
    uint64_t seed;        /**< shuffle seed (default 0)                                    */
    bool drop_last;       /**< drop the last incomplete batch (default false)             */
    int num_workers;      /**< loader threads; 0 loads in the calling thread (default 0)  */
    int prefetch;         /**< batches prepared ahead when num_workers > 0 (default 2 * num_workers) */
    /** Normalisation x' = (x - mean) / std, the same for every feature
     *  (default mean 0, std 1: unchanged), e.g. EM_FASHION_MNIST_MEAN/STD. */
    float mean, std;
    /** Per-feature normalisation (num_features values each, copied); when
     *  non-NULL they replace mean/std. Both or neither. */
    const float *feature_mean, *feature_std;
    /** Sharding for data-parallel training: this loader yields only the
     *  positions p of the (shuffled) epoch order with p % world_size == rank;
     *  the shards of ranks 0..world_size-1 are disjoint and together cover the
     *  dataset exactly (default rank 0, world_size 1). */
    int rank, world_size;
    /** With sharding, give every rank exactly floor(n / world_size) samples
     *  (the last n % world_size positions of the order are skipped this
     *  epoch) so that all ranks run the same number of steps (default false). */
    bool shard_even;
    /** Per-sample image transforms (random crop, flip, per-channel
     *  normalisation), seeded by @p seed; all zero (default) = none. */
    em_image_transform transform;
} em_loader_options;

/** The defaults listed above. */
EM_API em_loader_options em_loader_options_default(void);

/** One batch in host memory. Valid until the next em_loader_next /
 *  em_loader_start_epoch / em_loader_free on its loader; do not free. */
typedef struct em_batch {
    int64_t size;               /**< B: samples in this batch (<= batch_size)         */
    int64_t num_features;       /**< F                                               */
    const float *x;             /**< [B, F] float32, row-major, normalised           */
    const int64_t *y;           /**< [B] labels                                      */
    const int64_t *indices;     /**< [B] dataset index of each sample                */
    int64_t index;              /**< number of this batch in the epoch, from 0       */
    int64_t epoch;
    int feature_ndim;
    int64_t feature_shape[EM_MAX_DIMS];
} em_batch;

/** Converts a batch into new tensors: @p *x float32 [B, feature shape...]
 *  and @p *y int64 [B] (em_from_host copies; ownership as any new tensor:
 *  the current scope or the caller). Either output pointer may be NULL to
 *  skip it. On failure nothing is returned (both set to NULL). */
EM_API em_status em_batch_to_tensors(const em_batch *batch, em_tensor **x, em_tensor **y);

typedef struct em_loader em_loader;

/** New loader over @p ds (BORROWED: it must outlive the loader) with @p opt
 *  (NULL = defaults). EM_ERR_INVALID on bad options (batch_size < 1,
 *  rank outside [0, world_size), std == 0, ...). */
EM_API em_loader *em_loader_new(em_dataset *ds, const em_loader_options *opt);
/** Begins epoch @p epoch (>= 0): computes the order and (with workers) starts
 *  loading. An epoch in progress is abandoned.
 *
 *  Order: identity when !shuffle; otherwise a Fisher-Yates shuffle (from the
 *  last position down, j uniform in [0, i] by rejection sampling) driven by
 *  splitmix64 (Steele, Lea & Flood 2014) whose state starts at
 *  seed ^ (epoch * 0xD1B54A32D192ED03). The order, and so every batch,
 *  depends only on (seed, epoch, dataset length), never on num_workers. */
EM_API em_status em_loader_start_epoch(em_loader *l, int64_t epoch);
/** Next batch of the epoch, in order. Returns NULL at the end of the epoch
 *  (em_last_status() == EM_OK) or on failure (em_last_status() < 0 and the
 *  dataset's message, e.g. a read error, in em_last_error()); after a failure
 *  the epoch is over. Starts epoch 0 when no epoch was started. */
EM_API const em_batch *em_loader_next(em_loader *l);
/** Batches per epoch for this loader (its shard), given drop_last. */
EM_API int64_t em_loader_num_batches(const em_loader *l);
/** Samples per epoch for this loader (its shard). */
EM_API int64_t em_loader_num_samples(const em_loader *l);
/** Stops the workers and frees the loader (not the dataset). NULL is a no-op. */
EM_API void em_loader_free(em_loader *l);

/** The splitmix64 step used by the loader: advances *state by
 *  0x9E3779B97F4A7C15 and returns the mixed value. */
EM_API uint64_t em_splitmix64(uint64_t *state);

#ifdef __cplusplus
}
#endif
#endif
