/* The KServe v2 / Open Inference Protocol codec of `ember serve` (issue #18).
 *
 * Pure C on jansson: no HTTP, no StarPU, no model. The server (serve/http.c)
 * hands it request bodies and writes what it encodes; the fuzz target
 * tests/fuzz/fuzz_serve_request.c drives ems_request_decode directly.
 *
 * Wire format (https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
 * and Triton's binary tensor data extension, docs/protocol/extension_binary_data.md):
 *
 *   request  = { "id"?: string, "parameters"?: {...},
 *                "inputs": [ { "name": string, "shape": [int...], "datatype": string,
 *                              "parameters"?: { "binary_data_size"?: int },
 *                              "data"?: [...] } ... ],
 *                "outputs"?: [ { "name": string, "parameters"?: { "binary_data"?: bool } } ... ] }
 *   response = { "model_name": string, "model_version"?: string, "id"?: string,
 *                "outputs": [ { "name", "shape", "datatype",
 *                               "data": [...] | "parameters": { "binary_data_size": int } } ... ] }
 *   error    = { "error": string }
 *
 * With the binary extension the HTTP body is the JSON header followed by the
 * raw tensors in input (or output) order, and the header
 * Inference-Header-Content-Length gives the JSON's length in bytes. Raw
 * tensors are little-endian, row-major; BOOL is one byte (0 or 1) per element.
 */
#ifndef EMBER_SERVE_PROTOCOL_H
#define EMBER_SERVE_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMS_MAX_RANK 8        /**< the largest tensor rank a request may carry */
#define EMS_NAME_MAX 128      /**< tensor names are shorter than this (bytes, with the NUL) */
#define EMS_ID_MAX 256        /**< request ids are shorter than this */

/** The protocol's tensor datatypes ("BOOL", "UINT8", ..., "FP32", "BYTES";
 *  "BF16" is Triton's extension). BYTES is parsed and rejected by the
 *  decoder: no Ember model takes strings. */
typedef enum ems_dtype {
    EMS_BOOL, EMS_UINT8, EMS_UINT16, EMS_UINT32, EMS_UINT64,
    EMS_INT8, EMS_INT16, EMS_INT32, EMS_INT64,
    EMS_FP16, EMS_BF16, EMS_FP32, EMS_FP64, EMS_BYTES,
    EMS_DTYPE_COUNT
} ems_dtype;

/** "FP32" etc.; "?" for a value out of range. */
const char *ems_dtype_name(ems_dtype dt);
/** Parses a protocol datatype name (exact, upper case): 0, or -1. */
int ems_dtype_parse(const char *s, ems_dtype *out);
/** Bytes per element (1 for BOOL); 0 for BYTES and out-of-range values. */
size_t ems_dtype_size(ems_dtype dt);

/** One decoded tensor. data holds numel elements of dtype, packed
 *  row-major in host (little-endian) order, malloc'd and owned by the
 *  tensor (NULL when numel is 0). */
typedef struct ems_tensor {
    char name[EMS_NAME_MAX];
    ems_dtype dtype;
    int ndim;
    int64_t shape[EMS_MAX_RANK];
    int64_t numel;
    void *data;
    size_t nbytes; /**< numel * ems_dtype_size(dtype) */
} ems_tensor;

/** One requested output. */
typedef struct ems_output_request {
    char name[EMS_NAME_MAX];
    int binary; /**< parameters.binary_data: 1 true, 0 false, -1 not given (the request's binary_data_output decides) */
} ems_output_request;

/** A decoded infer request. Free with ems_request_free. */
typedef struct ems_request {
    char id[EMS_ID_MAX];
    bool has_id;
    int ninputs;
    ems_tensor *inputs;
    int noutputs;                /**< 0: the client asked for no particular output (all, as the protocol says) */
    ems_output_request *outputs;
    bool binary_data_output;     /**< parameters.binary_data_output (Triton): every output binary unless it says otherwise */
    int64_t timeout_us;          /**< parameters.timeout (Triton, microseconds); 0 when absent */
} ems_request;

/** Limits the decoder enforces before allocating anything large. */
typedef struct ems_limits {
    int max_inputs;        /**< inputs per request */
    int max_rank;          /**< <= EMS_MAX_RANK */
    int64_t max_elements;  /**< elements per tensor and in all inputs together */
} ems_limits;

/** max_inputs 64, max_rank EMS_MAX_RANK, max_elements 1 << 26 (64 Mi elements). */
ems_limits ems_limits_default(void);

/** Decodes an infer request body of @p len bytes. @p header_len is the value
 *  of the Inference-Header-Content-Length header, or -1 when the request
 *  had none (the whole body is JSON). JSON "data" may be flat or nested
 *  (row-major) and must hold exactly numel values of the datatype's kind
 *  (integers in range for integer types, true/false for BOOL, numbers for
 *  the FP types); "binary_data_size" inputs take their bytes from the
 *  binary section in input order, and the sizes must add up to the
 *  section's length exactly. FP16/BF16 JSON values are rounded to nearest
 *  even. Every input name must be unique and non-empty; shapes are
 *  non-negative with rank <= lim->max_rank. Returns 0, or -1 with a
 *  one-line message in @p err naming the input and what is wrong (an HTTP
 *  400 for the server); on failure @p out holds nothing to free (it is
 *  zeroed). */
int ems_request_decode(const char *body, size_t len, int64_t header_len, const ems_limits *lim, ems_request *out, char *err,
                       size_t nerr);
/** Frees what ems_request_decode allocated and zeroes @p r; NULL is a no-op. */
void ems_request_free(ems_request *r);

/** One output of a response: a tensor and whether it goes as binary data. */
typedef struct ems_response_output {
    const ems_tensor *tensor;
    bool binary;
} ems_response_output;

/** Encodes an infer response. model_version and id may be NULL (left out).
 *  Non-binary outputs go into "data" as flat JSON arrays (FP16/BF16 as
 *  numbers, NaN/inf, which JSON cannot hold, as null); binary outputs get
 *  "parameters": {"binary_data_size": N} and their bytes after the JSON.
 *  Returns a malloc'd body of *len bytes, and *header_len = the JSON's
 *  length when any output is binary (the server sends it as
 *  Inference-Header-Content-Length), else -1; NULL on allocation failure. */
char *ems_response_encode(const char *model_name, const char *model_version, const char *id, const ems_response_output *outs,
                          int nouts, size_t *len, int64_t *header_len);

/** {"error": msg} as a malloc'd NUL-terminated string (*len bytes without the
 *  NUL); msg is escaped as JSON requires. NULL on allocation failure. */
char *ems_error_json(const char *msg, size_t *len);

/** Converts @p t's elements to float (BOOL 0/1, integers exactly where f32
 *  can, FP16/BF16 widened, FP64 rounded) into dst[numel]: 0, or -1 for BYTES. */
int ems_tensor_to_f32(const ems_tensor *t, float *dst);
/** Converts integer (and BOOL) elements to int64 into dst[numel]: 0, or -1
 *  for a floating or BYTES tensor, or a UINT64 value above INT64_MAX. */
int ems_tensor_to_i64(const ems_tensor *t, int64_t *dst);

#endif
