/* Ember text data: tokenizers (bytes, GPT-2 byte-level BPE) and a dataset of
 * token ids sampled as random windows (language-model batches).
 *
 * Everything here is host memory and plain C arrays; no runtime (em_init) is
 * needed. Errors: functions return NULL or a negative em_status and record a
 * message for em_last_error() naming the file, line or position and what is
 * wrong. They never abort.
 *
 * Threads: a tokenizer and a text dataset are read-only after creation, so
 * encode / decode / em_text_batch may run concurrently on one object (each
 * call with its own rng state).
 */
#ifndef EMBER_TEXT_H
#define EMBER_TEXT_H

#include "ember/core.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizers ------------------------------------------------------------- */

typedef struct em_tokenizer em_tokenizer;

/** The byte tokenizer: byte b <-> id b, vocabulary 256 (the anchor's "byte
 *  vocabulary", ANCHORS.md). Never fails except on allocation (NULL,
 *  EM_ERR_NOMEM). Free with em_tokenizer_free. */
EM_API em_tokenizer *em_tokenizer_bytes(void);

/** GPT-2's byte-level BPE tokenizer from the two files of a Hugging Face /
 *  OpenAI GPT-2 tokenizer:
 *  - @p vocab_json_path: a JSON object {token: id}, tokens written in GPT-2's
 *    bytes_to_unicode alphabet (each byte shown as one code point), ids
 *    distinct integers in [0, 2^24) (bounds the id table; GPT-2 has 50 257,
 *    the largest published vocabularies ~ 200 000). All 256 single-byte tokens must be there
 *    (so every byte string is encodable).
 *  - @p merges_txt_path: one merge "A B" per line (A and B tokens of the
 *    vocabulary, A B concatenated also one), rank = order in the file; an
 *    optional first line starting with "#version", blank lines ignored,
 *    "\r\n" accepted.
 *  Encoding = GPT-2's: the text is split by GPT-2's pre-tokenization pattern
 *  ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+),
 *  each piece becomes its bytes, then adjacent pairs are merged by lowest
 *  rank until none applies. Special tokens (e.g. "<|endoftext|>") are not
 *  recognised in text: they are encoded as their characters (decode of
 *  their id gives their characters).
 *  Errors, naming the file and the line or token: EM_ERR_IO (cannot open),
 *  EM_ERR_FORMAT (invalid JSON, not an object, an id that is not an integer,
 *  negative, too large or repeated, an empty token, two tokens with the
 *  same bytes, a token with a code point outside the
 *  byte alphabet, a missing single-byte token, a merges line that is not
 *  two tokens separated by one space, a merge whose parts or result are not
 *  in the vocabulary, a repeated merge, more merges than tokens, a NUL byte
 *  in merges.txt), EM_ERR_NOMEM.
 *  Free with em_tokenizer_free. */
EM_API em_tokenizer *em_bpe_load(const char *vocab_json_path, const char *merges_txt_path);

/** Number of ids: 256 for bytes; max id + 1 for BPE (-1 and an error for NULL). */
EM_API int64_t em_tokenizer_vocab_size(const em_tokenizer *tok);

/** Encodes @p n bytes of @p text (any bytes: invalid UTF-8 and NUL included).
 *  On success *@p ids gets a malloc'ed array of *@p n_ids int64 ids (NULL
 *  when n_ids is 0), which the caller releases with free(). Invalid UTF-8 is
 *  split as if each offending byte were one code point of no class (neither
 *  letter, number nor space), which is what Python's
 *  bytes.decode("utf-8", "surrogateescape") followed by GPT-2's regex does.
 *  decode(encode(s)) == s byte for byte, for every s.
 *  Errors: EM_ERR_INVALID (NULL arguments with n > 0), EM_ERR_NOMEM. */
EM_API em_status em_tokenizer_encode(const em_tokenizer *tok, const void *text, size_t n,
                                     int64_t **ids, size_t *n_ids);

/** Decodes @p n ids to bytes: *@p bytes gets a malloc'ed buffer of *@p n_bytes
 *  bytes plus a terminating NUL (not counted), released with free().
 *  Errors: EM_ERR_INVALID naming the position of an id that is not in the
 *  vocabulary (negative, too large, or a gap of vocab.json), EM_ERR_NOMEM. */
EM_API em_status em_tokenizer_decode(const em_tokenizer *tok, const int64_t *ids, size_t n,
                                     char **bytes, size_t *n_bytes);

/** The bytes of token @p id (not NUL-terminated, borrowed from @p tok, valid
 *  until it is freed) and their count in *@p len; NULL and an EM_ERR_INVALID
 *  error when @p id is not in the vocabulary. */
EM_API const char *em_tokenizer_token(const em_tokenizer *tok, int64_t id, size_t *len);

/** The id of the token whose bytes are @p bytes[0..len), or -1 when there is
 *  none (no error recorded: a plain lookup). */
EM_API int64_t em_tokenizer_lookup(const em_tokenizer *tok, const void *bytes, size_t len);

/** Frees the tokenizer (NULL is a no-op). */
EM_API void em_tokenizer_free(em_tokenizer *tok);

/** GPT-2's bytes_to_unicode: the code point that shows byte @p b in
 *  vocab.json / merges.txt ('!'..'~', 0xA1..0xAC and 0xAE..0xFF show
 *  themselves; the 68 others map to U+0100.. in byte order). */
EM_API uint32_t em_gpt2_byte_to_unicode(uint8_t b);

/** GPT-2's pre-tokenization alone: splits @p text[0..n) into pieces and writes
 *  the END offset of each piece (exclusive, increasing, the last == n) into
 *  @p ends when @p cap allows; returns the number of pieces (which may exceed
 *  @p cap: call again with a larger array). Letters, numbers and spaces are
 *  classified with a table of Unicode 14.0 (data/unicode_classes.h, generated
 *  by scripts/gen-unicode-classes.py: L* categories, N* categories, the
 *  White_Space property); code points assigned after 14.0 are "other".
 *  Invalid UTF-8: as em_tokenizer_encode. Never fails (0 for n == 0). */
EM_API size_t em_gpt2_pretokenize(const void *text, size_t n, size_t *ends, size_t cap);

/* ---- text dataset ----------------------------------------------------------- */

typedef struct em_text_dataset em_text_dataset;

/** Which part of a text dataset a batch is drawn from. */
typedef enum em_text_split {
    EM_TEXT_TRAIN = 0, /**< ids [0, n_train)              */
    EM_TEXT_VAL = 1,   /**< ids [n_train, n)              */
    EM_TEXT_ALL = 2,   /**< ids [0, n)                    */
} em_text_split;

/** Text dataset from @p n bytes in memory, tokenized with @p tok (BORROWED
 *  only during the call; the ids are stored, int32). The split: n_train =
 *  (int64_t)(train_fraction * n_ids), the anchor's int(0.9 * len(data))
 *  (gpt_char.py), train = the first n_train ids, val = the rest;
 *  train_fraction in [0, 1]. The caller keeps @p bytes.
 *  Errors: EM_ERR_INVALID (NULL, fraction outside [0, 1] or NaN, a vocabulary
 *  over 2^31 ids), EM_ERR_NOMEM, and the tokenizer's errors. Free with em_text_dataset_free. */
EM_API em_text_dataset *em_text_dataset_from_memory(const void *bytes, size_t n,
                                                    const em_tokenizer *tok,
                                                    double train_fraction);
/** The same from a file read whole; EM_ERR_IO naming @p path when it cannot
 *  be opened or read. */
EM_API em_text_dataset *em_text_dataset_from_file(const char *path, const em_tokenizer *tok,
                                                  double train_fraction);
/** The same from ids already encoded (copied; each in [0, 2^31)). */
EM_API em_text_dataset *em_text_dataset_from_ids(const int64_t *ids, size_t n,
                                                 double train_fraction);

/** Number of ids in @p split (-1 and an error for NULL or a bad split). */
EM_API int64_t em_text_dataset_length(const em_text_dataset *ds, em_text_split split);
/** The ids of the whole dataset (borrowed, int32, length EM_TEXT_ALL); train
 *  starts at 0, val at em_text_dataset_length(ds, EM_TEXT_TRAIN). */
EM_API const int32_t *em_text_dataset_ids(const em_text_dataset *ds);
/** Vocabulary size of the tokenizer it was built with (max id + 1 for
 *  em_text_dataset_from_ids). */
EM_API int64_t em_text_dataset_vocab_size(const em_text_dataset *ds);

/** A language-model batch, as gpt_char.py's batch(): @p batch windows of
 *  @p block + 1 consecutive ids of @p split, each starting at an offset drawn
 *  uniformly from [0, len - block - 1) (torch.randint(len - T - 1), the
 *  anchor's range); x[b, t] = window[t], y[b, t] = window[t + 1], both int64
 *  row-major [batch, block] caller buffers. The draws come from the 64-bit
 *  state *@p rng (splitmix64, unbiased by rejection), advanced by the call:
 *  the same state gives the same batch on every machine (not torch's
 *  stream). Start with *rng = any seed.
 *  Why not em_dataset / em_loader: their samples are float features with one
 *  int64 label, while a window is block int64 inputs with block int64
 *  targets, and a random-window sampler has no fixed sample list to shuffle.
 *  Errors: EM_ERR_INVALID (NULL, batch or block < 1, a split shorter than
 *  block + 2 ids, which has no window to draw). */
EM_API em_status em_text_batch(const em_text_dataset *ds, em_text_split split,
                               int64_t batch, int64_t block, uint64_t *rng,
                               int64_t *x, int64_t *y);

/** Frees the dataset (NULL is a no-op). */
EM_API void em_text_dataset_free(em_text_dataset *ds);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_TEXT_H */
