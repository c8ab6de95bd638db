/* Ember store: SafeTensors files (read, write, load into model tensors).
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * u64 N, N bytes of UTF-8 JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the byte buffer; offsets are relative to the buffer's start, each
 * tensor's data is contiguous, C order, little-endian. Files written here are
 * read by Python's safetensors / PyTorch (header padded with spaces to a
 * multiple of 8, tensors laid out back to back).
 *
 * Errors: NULL or a negative em_status, with a message naming the file and,
 * where it applies, the tensor (key) and what is wrong. Nothing is ever left
 * half-written: saving goes through a temporary file and rename(2).
 *
 * Byte order: the host must be little-endian (x86-64, ARM64).
 */
#ifndef EMBER_STORE_H
#define EMBER_STORE_H

#include "ember/nn.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest JSON header accepted (as the reference implementation: 100 MB). */
#define EM_ST_MAX_HEADER ((uint64_t)100000000)

/** One tensor of an open file. Pointers stay valid until em_safetensors_close. */
typedef struct em_st_tensor {
    const char *name;
    /** Ember dtype, or EM_DTYPE_COUNT when the file's dtype has no Ember
     *  equivalent (I8, I16, U16, U32, U64, C64, F4, F6_E2M3, F6_E3M2,
     *  F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ): such tensors can
     *  be inspected as bytes but not turned into em_tensor (EM_ERR_DTYPE,
     *  "unsupported dtype I16 for tensor 'x'"). F16 and BF16 load as
     *  EM_F16 / EM_BF16, bit for bit. */
    em_dtype dtype;
    const char *st_dtype;        /**< dtype as written in the file ("F32", ...)   */
    size_t elem_size;            /**< bytes per element; 0 for the sub-byte F4 / F6_* */
    int ndim;                    /**< 0 (scalar) .. EM_MAX_DIMS                     */
    int64_t shape[EM_MAX_DIMS];
    int64_t numel;
    const void *data;            /**< nbytes of little-endian C-order data, aligned to elem_size */
    size_t nbytes;
    uint64_t data_begin;         /**< offsets in the file's byte buffer            */
    uint64_t data_end;
} em_st_tensor;

/** A metadata entry: a pair of UTF-8 strings. */
typedef struct em_st_kv {
    const char *key;
    const char *value;
} em_st_kv;

typedef struct em_st_file em_st_file;

/** Reads and validates a whole SafeTensors file into memory, with the
 *  reference crate's rules (docs/file-formats.md lists each rule, the crate's
 *  verdict and Ember's). Errors, each naming @p path and, where it applies,
 *  the tensor: EM_ERR_IO cannot open/read; EM_ERR_FORMAT: file shorter than
 *  8 bytes; header length above EM_ST_MAX_HEADER or beyond the file; header
 *  not UTF-8 (naming the byte) / not JSON (trailing characters included) /
 *  not an object / duplicate key; entry not an object; unknown dtype; shape
 *  not a list of integers >= 0; data_offsets not [begin, end] with
 *  0 <= begin <= end; the tensors, sorted by offsets, not contiguous from 0
 *  (a hole names its bytes, an overlap both tensors); a shape whose element
 *  or bit count overflows 64 bits; sub-byte elements not filling whole
 *  bytes; numel * size != end - begin; the last end before the end of the
 *  byte buffer (trailing bytes) or beyond it (truncated file);
 *  __metadata__ not an object of strings (null is accepted).
 *  EM_ERR_UNSUPPORTED: a valid file with a tensor of rank > EM_MAX_DIMS.
 *  Leading JSON whitespace and trailing spaces in the header are accepted;
 *  unknown fields of an entry are ignored. */
EM_API em_st_file *em_safetensors_open(const char *path);
/** Same from @p n bytes in memory (copied); @p name is used in messages
 *  (NULL = "<memory>"). */
EM_API em_st_file *em_safetensors_open_memory(const void *data, size_t n, const char *name);
/** Frees the file and everything it returned. NULL is a no-op. */
EM_API void em_safetensors_close(em_st_file *f);

/** Number of tensors (metadata not counted). */
EM_API size_t em_safetensors_count(const em_st_file *f);
/** Tensor @p i in name order (strcmp), or NULL (with an error) when out of range. */
EM_API const em_st_tensor *em_safetensors_at(const em_st_file *f, size_t i);
/** Tensor called @p name, or NULL with EM_ERR_INVALID ("no tensor 'x' in file"). */
EM_API const em_st_tensor *em_safetensors_find(const em_st_file *f, const char *name);
/** A new em_tensor holding a copy of tensor @p name (ownership as any new
 *  tensor). NULL when missing or its dtype has no Ember equivalent. */
EM_API em_tensor *em_safetensors_tensor(const em_st_file *f, const char *name);

/** Value of metadata @p key, or NULL (no error recorded) when absent. */
EM_API const char *em_safetensors_metadata(const em_st_file *f, const char *key);
/** Number of metadata entries. */
EM_API size_t em_safetensors_metadata_count(const em_st_file *f);
/** Metadata entry @p i (file order), or NULL when out of range. */
EM_API const em_st_kv *em_safetensors_metadata_at(const em_st_file *f, size_t i);

/** Writes @p n tensors under @p names (distinct, non-empty UTF-8, not
 *  "__metadata__") plus @p n_meta metadata pairs to @p path, ATOMICALLY: the
 *  data goes to "<path>.tmp.XXXXXX" in the same directory, is fsync'ed and
 *  renamed over @p path; on any failure the temporary file is removed and an
 *  existing @p path is left untouched. Tensors may be views (copied out in C
 *  order); f16/bf16 are stored as F16/BF16. The layout is the reference
 *  writer's (dtypes in the crate's order, descending, then names; header
 *  padded with spaces to a multiple of 8): without metadata the file is
 *  byte for byte what safetensors.torch.save_file writes. Waits for pending tasks on the
 *  tensors. Errors: EM_ERR_INVALID (NULL or duplicate name/tensor), EM_ERR_IO
 *  (cannot create/write/rename, message with errno text), and whatever
 *  em_to_host reports. */
EM_API em_status em_safetensors_save(const char *path, const char *const names[], em_tensor *const tensors[],
                                     size_t n, const em_st_kv *metadata, size_t n_meta);

/** Loads tensors of the file at @p path into @p targets (the model's
 *  parameters, written in place with em_copy_). Every names[i] must be in the
 *  file with exactly targets[i]'s shape and dtype; with @p strict the file
 *  must hold no other tensor. Everything is checked before anything is
 *  written, so on failure no target has changed. Errors (EM_ERR_FORMAT for a
 *  missing / unexpected key, EM_ERR_SHAPE, EM_ERR_DTYPE) name the file and
 *  the key, e.g. "model.safetensors: key 'fc1.weight': shape [256, 784] in
 *  file, [128, 784] in model"; a missing-keys message lists them all (up to
 *  a length). */
EM_API em_status em_safetensors_load_into(const char *path, const char *const names[], em_tensor *const targets[],
                                          size_t n, bool strict);
/** Same from an open file (messages name the path it was opened from). */
EM_API em_status em_safetensors_load_from(const em_st_file *f, const char *const names[],
                                          em_tensor *const targets[], size_t n, bool strict);

/** Loads a Hugging Face GPT-2 SafeTensors file into @p m, a model made by
 *  em_gpt2_new (all parameters, in place as em_safetensors_load_from).
 *  Each parameter key "transformer.X" is looked up as written, else as "X":
 *  HF's base-model files (the hub's gpt2/model.safetensors) store "wte.weight",
 *  "h.0.attn.c_attn.weight", ... without the prefix; fine-tuned
 *  GPT2LMHeadModel files keep it. Other tensors HF writes are accepted and
 *  not loaded: "lm_head.weight" (tied to wte; its shape must be wte's, its
 *  values are not read: the model's one tensor comes from wte, as HF ties
 *  on load) and the causal-mask buffers "*.attn.bias" / "*.attn.masked_bias"
 *  of older files. Any other extra key, or a missing one, is an error, and
 *  nothing is written then. Conv1D weights are taken as stored ([in, out],
 *  no transpose). Errors: EM_ERR_INVALID (not a GPT2LMHeadModel, NULL path),
 *  EM_ERR_FORMAT naming the path and the missing ('transformer.X' or 'X') or
 *  unexpected key, EM_ERR_SHAPE / EM_ERR_DTYPE as em_safetensors_load_from,
 *  and em_safetensors_open's errors. */
EM_API em_status em_gpt2_load_hf_safetensors(em_module *m, const char *path);

/* ---- NumPy .npy ----------------------------------------------------------------- */

/** Reads a .npy file (format 1.0 to 3.0, C order; dtypes <f4 <f8 <f2 <i4 <i8
 *  |u1 |b1 → f32 f64 f16 i32 i64 u8 bool). Returns a new tensor (tensor.h
 *  ownership rules) or NULL: EM_ERR_IO, EM_ERR_FORMAT (not .npy, a header or
 *  size that does not match), EM_ERR_UNSUPPORTED (Fortran order, another
 *  dtype, rank above EM_MAX_DIMS), each naming the file. */
EM_API em_tensor *em_npy_load(const char *path);
/** Writes @p t as a .npy 1.0 file (C order; bf16 is EM_ERR_DTYPE: numpy has
 *  no bfloat16), atomically as em_safetensors_save: an existing @p path is
 *  untouched on failure. Waits for pending tasks on @p t. */
EM_API em_status em_npy_save(const char *path, const em_tensor *t);

/** SafeTensors dtype string of an Ember dtype ("F32", "BOOL", ...), NULL if invalid. */
EM_API const char *em_safetensors_dtype_str(em_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
