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

/* ---- PyTorch checkpoints (torch.save, .pt / .pth) -------------------------------
 *
 * Format (torch >= 1.6, the default since): a zip archive ("<dir>/data.pkl",
 * "<dir>/data/0", "<dir>/data/1", ..., "<dir>/version"; <dir> is any folder
 * name) whose data.pkl is a pickle (protocol 2 by default) of the saved
 * object; each tensor's storage is a record "<dir>/data/<key>" of raw
 * little-endian elements. Records may be STORED (torch's writer) or DEFLATEd
 * (a re-zipped file); ZIP64 is read; every record's CRC-32 is checked.
 *
 * Safety: data.pkl is read by a small pickle machine that knows only the
 * opcodes a state_dict uses and calls nothing: the only globals accepted are
 * collections.OrderedDict, torch._utils._rebuild_tensor_v2,
 * torch._utils._rebuild_parameter and the storage classes torch.FloatStorage,
 * DoubleStorage, HalfStorage, BFloat16Storage, LongStorage, IntStorage,
 * ByteStorage and BoolStorage (f32, f64, f16, bf16, i64, i32, u8, bool). Any
 * other global (os.system, builtins.eval, ...), a REDUCE of anything else, an
 * unknown opcode, a size, offset or stride outside its storage, more than
 * EM_PT_MAX_MARKS nested MARKs or EM_PT_MAX_DEPTH nested containers,
 * containers shared so that flattening would walk more than 4 x the
 * pickle's size + 4096 items, a view expanding (stride 0) to more than
 * 64 x the file's size + 16 MiB is an
 * EM_ERR_FORMAT error naming the file, the opcode or global and its byte
 * offset in data.pkl, e.g. "evil.pt: data.pkl byte 2: GLOBAL 'os.system' is
 * not allowed (a state_dict needs only collections.OrderedDict, torch._utils
 * tensor rebuilders and torch storages)". Nothing in the file is ever executed.
 *
 * What is read: the top-level object must be a dict (a state_dict, or a
 * checkpoint such as {"model": state_dict, "epoch": 3}). Its tensors are
 * listed with dotted keys: nested dicts, lists and tuples are flattened with
 * "." joins ("model.fc1.weight", "optim.state.0.exp_avg"; int keys and list
 * indices written in decimal); values that are not tensors (ints, floats,
 * strings, None) are skipped. Two tensors with the same flattened key are an
 * error. Tensors that share a storage (views, tied weights) each get their
 * own copy; non-contiguous tensors (a saved transpose or strided slice) are
 * gathered through their strides into C order.
 *
 * Not supported (EM_ERR_UNSUPPORTED, a clear message): the legacy pre-1.6
 * format ("legacy (pre-1.6) torch.save format is not supported; re-save with
 * torch>=1.6"), TorchScript archives (torch.jit.save), storages of other
 * dtypes (i8, i16, complex, ...), tensors of rank > EM_MAX_DIMS.
 * Byte order: the host and the file must be little-endian. */

/** Nested MARKs data.pkl may hold (a state_dict needs 3). */
#define EM_PT_MAX_MARKS 256
/** Nesting of dicts / lists / tuples below the top-level dict. */
#define EM_PT_MAX_DEPTH 64

/** One tensor of an open checkpoint. Pointers stay valid until em_pt_close. */
typedef struct em_pt_entry {
    const char *name;            /**< flattened key ("fc1.weight", "model.0.bias") */
    em_dtype dtype;              /**< EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_I32, EM_U8 or EM_BOOL */
    const char *storage_type;    /**< as in the file: "FloatStorage", ...          */
    int ndim;                    /**< 0 (scalar) .. EM_MAX_DIMS                     */
    int64_t shape[EM_MAX_DIMS];
    int64_t numel;
    const void *data;            /**< nbytes of C-order little-endian data (a copy, 64-byte aligned) */
    size_t nbytes;               /**< numel * em_dtype_size(dtype)                  */
    /* where it came from, for inspection */
    const char *storage_key;     /**< the record "<dir>/data/<storage_key>"         */
    int64_t storage_offset;      /**< in elements                                   */
    int64_t stride[EM_MAX_DIMS]; /**< in elements, as saved                         */
} em_pt_entry;

typedef struct em_pt_file em_pt_file;

/** Reads a torch.save file (whole, into memory) and gathers every tensor.
 *  Returns NULL on failure: EM_ERR_IO (cannot open / read), EM_ERR_FORMAT
 *  (not a zip archive, damaged zip structures or CRC, no data.pkl, a pickle
 *  outside the safe subset above, a storage record missing or of the wrong
 *  size, a tensor outside its storage, shape overflow, top level not a
 *  dict, duplicate key), EM_ERR_UNSUPPORTED (legacy format, TorchScript,
 *  other dtypes, rank), EM_ERR_NOMEM; each message names @p path. */
EM_API em_pt_file *em_pt_open(const char *path);
/** Same from @p n bytes in memory (not kept: the tensors are copied out);
 *  @p name is used in messages (NULL = "<memory>"). */
EM_API em_pt_file *em_pt_open_memory(const void *data, size_t n, const char *name);
/** Frees the file and everything it returned. NULL is a no-op. */
EM_API void em_pt_close(em_pt_file *f);
/** Number of tensors found. */
EM_API size_t em_pt_count(const em_pt_file *f);
/** Tensor @p i in file order (the state_dict's order), or NULL with
 *  EM_ERR_INVALID when out of range. */
EM_API const em_pt_entry *em_pt_at(const em_pt_file *f, size_t i);
/** Flattened key of tensor @p i (borrowed), NULL when out of range. */
EM_API const char *em_pt_name(const em_pt_file *f, size_t i);
/** Tensor called @p name, or NULL with EM_ERR_INVALID ("no tensor 'x' in the file"). */
EM_API const em_pt_entry *em_pt_find(const em_pt_file *f, const char *name);
/** A new em_tensor (contiguous, the file's dtype and exact bits) holding a
 *  copy of tensor @p i; ownership as any new tensor. Needs em_init. */
EM_API em_tensor *em_pt_tensor(const em_pt_file *f, size_t i);

/** Key remapping as Burn's store: each rule is "PATTERN=REPLACEMENT" (split
 *  at the first '=' outside a bracket expression: write a '=' of the
 *  pattern as "[=]"), PATTERN a POSIX
 *  extended regex; rules apply in order, each to the result of the previous
 *  one, every non-overlapping match replaced (as Python's re.sub). In
 *  REPLACEMENT, \0 is the whole match, \1 .. \9 the groups, "\\" a
 *  backslash. Example: {"^model\\.=", "^fc([0-9])\\.(.*)=layers.\\1.\\2"}
 *  maps "model.fc1.weight" to "layers.1.weight". Writes the result (NUL
 *  terminated) to @p out of @p n bytes. Errors (EM_ERR_INVALID): a rule
 *  without '=', a bad regex (regerror's text), a back-reference to a group
 *  the pattern lacks, a result longer than @p n - 1. */
EM_API em_status em_pt_remap_key(const char *const rules[], int nrules, const char *key, char *out, size_t n);

/** Loads the checkpoint at @p path into the parameters and buffers of @p m
 *  (keys as em_module_visit_params / _buffers: PyTorch's state_dict keys),
 *  in place (em_copy_). Each file key is first remapped by @p rules
 *  (em_pt_remap_key; NULL / 0 = none). With @p strict every module key must
 *  be in the file and every file key must be a module key; without it keys
 *  on one side only are skipped. A loaded key must match the module tensor's
 *  shape and dtype exactly. Everything is checked before anything is
 *  written, so on failure the module is unchanged. Errors, naming the file:
 *  em_pt_open's; EM_ERR_INVALID (NULL module, bad rule, two file keys
 *  remapped to the same key: both named); EM_ERR_FORMAT (missing and
 *  unexpected keys, all listed up to a length, as
 *  em_safetensors_load_from); EM_ERR_SHAPE "key 'fc1.weight' (file key
 *  'model.fc1.weight'): shape [8, 4] in file, [8, 3] in model";
 *  EM_ERR_DTYPE likewise. */
EM_API em_status em_pt_load_into(em_module *m, const char *path, const char *const rules[], int nrules, bool strict);
/** Same from an open file. */
EM_API em_status em_pt_load_from(em_module *m, const em_pt_file *f, const char *const rules[], int nrules, bool strict);

#ifdef __cplusplus
}
#endif
#endif
