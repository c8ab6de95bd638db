/* The KServe v2 / Open Inference Protocol codec of `ember serve` (see
 * serve/protocol.h for the contract and the wire format).
 *
 * Decoding parses the JSON header with jansson and checks everything in two
 * passes: the first validates every input's metadata (name, datatype, shape,
 * limits, data count or binary size) and the binary section's accounting
 * without allocating tensor memory; the second allocates and fills. Encoding
 * writes the JSON itself (not through jansson values) so that UINT64 prints
 * exactly, FP32 prints with 9 significant digits, FP64 with 17, FP16 with 5
 * and BF16 with 4: each enough to round-trip the value through decoding.
 *
 * Choices the protocol leaves open:
 *   - JSON "data" may be nested in any way (Triton flattens too): only the
 *     flattened, row-major count must equal numel; nesting depth is capped
 *     at DATA_MAX_DEPTH.
 *   - Integer types take JSON integers only (1.0 is rejected as 1.5 is);
 *     jansson holds JSON integers as int64, so JSON UINT64 values stop at
 *     INT64_MAX (the binary form carries the full range).
 *   - FP types take integers and reals; a value beyond the type's range
 *     rounds to infinity, as a cast does (FP16/BF16 go through f32, ties to even).
 *   - BOOL takes true/false only in JSON, bytes 0 or 1 only in binary.
 *   - A rank-0 shape [] is a scalar of one element.
 *   - Unknown keys and parameters are ignored (the protocol lets clients add
 *     their own).
 * Numbers print with snprintf: the process must keep the "C" LC_NUMERIC locale. */
#define _GNU_SOURCE
#include "serve/protocol.h"

#include "devices/half_host.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "serve/protocol.c assumes a little-endian host"
#endif

#define DATA_MAX_DEPTH 64 /**< the deepest nesting of JSON "data" arrays accepted */

/* ---- datatypes ------------------------------------------------------------------ */

static const char *const dtype_names[EMS_DTYPE_COUNT] = {
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "BF16",  "FP32",   "FP64",   "BYTES",
};
static const size_t dtype_sizes[EMS_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 0};

const char *ems_dtype_name(ems_dtype dt)
{
    if ((int)dt < 0 || dt >= EMS_DTYPE_COUNT) return "?";
    return dtype_names[dt];
}

int ems_dtype_parse(const char *s, ems_dtype *out)
{
    if (!s) return -1;
    for (int d = 0; d < EMS_DTYPE_COUNT; d++)
        if (!strcmp(s, dtype_names[d])) {
            if (out) *out = (ems_dtype)d;
            return 0;
        }
    return -1;
}

size_t ems_dtype_size(ems_dtype dt)
{
    if ((int)dt < 0 || dt >= EMS_DTYPE_COUNT) return 0;
    return dtype_sizes[dt];
}

static bool dtype_is_float(ems_dtype dt) { return dt == EMS_FP16 || dt == EMS_BF16 || dt == EMS_FP32 || dt == EMS_FP64; }

ems_limits ems_limits_default(void)
{
    ems_limits l = {.max_inputs = 64, .max_rank = EMS_MAX_RANK, .max_elements = (int64_t)1 << 26};
    return l;
}

/* ---- errors ----------------------------------------------------------------------- */

/* Writes a message into err and makes it one line: control bytes (a newline
 * in a client's tensor name, say) become '?'. */
static void set_err(char *err, size_t nerr, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t nerr, const char *fmt, ...)
{
    if (!err || nerr == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, nerr, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

/* "[2,3]" into buf (truncated with "..." if it does not fit). */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? "," : "", shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    if (k >= n && n > 4) strcpy(buf + n - 4, "...");
    return buf;
}

/* ---- decoding --------------------------------------------------------------------- */

/* What the first pass learns about one input. */
typedef struct input_plan {
    json_t *data;      /* the "data" array, or NULL for a binary input */
    size_t bin_size;   /* binary_data_size */
    size_t bin_offset; /* where its bytes start in the binary section */
} input_plan;

/* Counts the scalars under a (nested) JSON array; stops early once past
 * @p stop. Returns -1 when nested deeper than DATA_MAX_DEPTH. */
static int64_t data_count(const json_t *a, int depth, int64_t stop)
{
    if (depth > DATA_MAX_DEPTH) return -1;
    int64_t n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (json_is_array(v)) {
            int64_t c = data_count(v, depth + 1, stop - n);
            if (c < 0) return -1;
            n += c;
        } else {
            n++;
        }
        if (n > stop) return n;
    }
    return n;
}

typedef struct fill_ctx {
    const ems_tensor *t;
    int64_t idx;
    char *err;
    size_t nerr;
} fill_ctx;

/* Stores JSON scalar v as element ctx->idx of ctx->t: 0, or -1 with a message. */
static int store_value(fill_ctx *c, const json_t *v)
{
    const ems_tensor *t = c->t;
    int64_t i = c->idx;
    void *d = t->data;
    if (t->dtype == EMS_BOOL) {
        if (!json_is_boolean(v)) {
            set_err(c->err, c->nerr, "input '%s': data[%" PRId64 "] is not true or false (BOOL takes booleans)", t->name, i);
            return -1;
        }
        ((uint8_t *)d)[i] = json_is_true(v) ? 1 : 0;
        return 0;
    }
    if (dtype_is_float(t->dtype)) {
        if (!json_is_number(v)) {
            set_err(c->err, c->nerr, "input '%s': data[%" PRId64 "] is not a number (%s takes numbers)", t->name, i,
                    ems_dtype_name(t->dtype));
            return -1;
        }
        double x = json_number_value(v);
        switch (t->dtype) {
        case EMS_FP16: ((uint16_t *)d)[i] = em_f32_to_f16_bits((float)x); break;
        case EMS_BF16: ((uint16_t *)d)[i] = em_f32_to_bf16_bits((float)x); break;
        case EMS_FP32: ((float *)d)[i] = (float)x; break;
        default: ((double *)d)[i] = x; break;
        }
        return 0;
    }
    if (!json_is_integer(v)) {
        set_err(c->err, c->nerr, "input '%s': data[%" PRId64 "] is not an integer (%s takes integers)", t->name, i,
                ems_dtype_name(t->dtype));
        return -1;
    }
    json_int_t x = json_integer_value(v);
    int64_t lo = 0, hi = 0;
    switch (t->dtype) {
    case EMS_UINT8: hi = UINT8_MAX; break;
    case EMS_UINT16: hi = UINT16_MAX; break;
    case EMS_UINT32: hi = UINT32_MAX; break;
    case EMS_UINT64: hi = INT64_MAX; break;
    case EMS_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
    case EMS_INT16: lo = INT16_MIN, hi = INT16_MAX; break;
    case EMS_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
    default: lo = INT64_MIN, hi = INT64_MAX; break;
    }
    if (x < lo || x > hi) {
        set_err(c->err, c->nerr, "input '%s': data[%" PRId64 "] is %lld, out of range for %s", t->name, i, (long long)x,
                ems_dtype_name(t->dtype));
        return -1;
    }
    switch (t->dtype) {
    case EMS_UINT8: ((uint8_t *)d)[i] = (uint8_t)x; break;
    case EMS_UINT16: ((uint16_t *)d)[i] = (uint16_t)x; break;
    case EMS_UINT32: ((uint32_t *)d)[i] = (uint32_t)x; break;
    case EMS_UINT64: ((uint64_t *)d)[i] = (uint64_t)x; break;
    case EMS_INT8: ((int8_t *)d)[i] = (int8_t)x; break;
    case EMS_INT16: ((int16_t *)d)[i] = (int16_t)x; break;
    case EMS_INT32: ((int32_t *)d)[i] = (int32_t)x; break;
    default: ((int64_t *)d)[i] = (int64_t)x; break;
    }
    return 0;
}

/* Flattens a (nested) array into the tensor, row-major. The first pass
 * checked the count and the depth. */
static int fill_values(fill_ctx *c, const json_t *a)
{
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (json_is_array(v)) {
            if (fill_values(c, v)) return -1;
        } else {
            if (store_value(c, v)) return -1;
            c->idx++;
        }
    }
    return 0;
}

/* A name field: a non-empty string shorter than EMS_NAME_MAX, copied to dst. */
static int get_name(const json_t *o, const char *what, int index, char *dst, char *err, size_t nerr)
{
    const json_t *n = json_object_get(o, "name");
    if (!n) {
        set_err(err, nerr, "%s %d has no name", what, index);
        return -1;
    }
    if (!json_is_string(n)) {
        set_err(err, nerr, "%s %d: name is not a string", what, index);
        return -1;
    }
    size_t l = json_string_length(n);
    if (l == 0) {
        set_err(err, nerr, "%s %d: name is empty", what, index);
        return -1;
    }
    if (l >= EMS_NAME_MAX) {
        set_err(err, nerr, "%s %d: name is %zu bytes long, the longest allowed is %d", what, index, l, EMS_NAME_MAX - 1);
        return -1;
    }
    memcpy(dst, json_string_value(n), l + 1);
    return 0;
}

/* First pass over input k: fills t's metadata and p; allocates nothing. */
static int plan_input(const json_t *in, int k, const ems_limits *lim, json_t *seen, int64_t *total, ems_tensor *t, input_plan *p,
                      char *err, size_t nerr)
{
    if (!json_is_object(in)) {
        set_err(err, nerr, "input %d is not an object", k);
        return -1;
    }
    if (get_name(in, "input", k, t->name, err, nerr)) return -1;
    const char *nm = t->name;
    if (json_object_get(seen, nm)) {
        set_err(err, nerr, "input '%s' appears twice", nm);
        return -1;
    }
    if (json_object_set_new(seen, nm, json_null())) {
        set_err(err, nerr, "out of memory");
        return -1;
    }

    const json_t *dt = json_object_get(in, "datatype");
    if (!dt) {
        set_err(err, nerr, "input '%s' has no datatype", nm);
        return -1;
    }
    if (!json_is_string(dt)) {
        set_err(err, nerr, "input '%s': datatype is not a string", nm);
        return -1;
    }
    if (ems_dtype_parse(json_string_value(dt), &t->dtype)) {
        set_err(err, nerr, "input '%s': unknown datatype '%.32s'", nm, json_string_value(dt));
        return -1;
    }
    if (t->dtype == EMS_BYTES) {
        set_err(err, nerr, "input '%s': BYTES inputs are not supported", nm);
        return -1;
    }

    const json_t *sh = json_object_get(in, "shape");
    if (!sh) {
        set_err(err, nerr, "input '%s' has no shape", nm);
        return -1;
    }
    if (!json_is_array(sh)) {
        set_err(err, nerr, "input '%s': shape is not an array", nm);
        return -1;
    }
    int max_rank = lim->max_rank < EMS_MAX_RANK ? lim->max_rank : EMS_MAX_RANK;
    if (json_array_size(sh) > (size_t)(max_rank < 0 ? 0 : max_rank)) {
        set_err(err, nerr, "input '%s': shape has rank %zu, the largest allowed is %d", nm, json_array_size(sh), max_rank);
        return -1;
    }
    t->ndim = (int)json_array_size(sh);
    bool zero = false;
    for (int d = 0; d < t->ndim; d++) {
        const json_t *v = json_array_get(sh, (size_t)d);
        if (!json_is_integer(v)) {
            set_err(err, nerr, "input '%s': shape[%d] is not an integer", nm, d);
            return -1;
        }
        json_int_t x = json_integer_value(v);
        if (x < 0) {
            set_err(err, nerr, "input '%s': shape[%d] is negative (%lld)", nm, d, (long long)x);
            return -1;
        }
        if (x > lim->max_elements) {
            set_err(err, nerr, "input '%s': shape[%d] is %lld, more than the limit of %" PRId64 " elements", nm, d, (long long)x,
                    lim->max_elements);
            return -1;
        }
        t->shape[d] = x;
        if (x == 0) zero = true;
    }
    char sb[160];
    int64_t numel = 1;
    if (zero) {
        numel = 0;
    } else {
        /* each dim is <= max_elements; stop as soon as the product passes it */
        for (int d = 0; d < t->ndim; d++) {
            if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > lim->max_elements) {
                set_err(err, nerr, "input '%s': shape %s has more than the limit of %" PRId64 " elements", nm,
                        shape_str(t->shape, t->ndim, sb, sizeof sb), lim->max_elements);
                return -1;
            }
        }
    }
    if (numel > lim->max_elements) {
        set_err(err, nerr, "input '%s': shape %s has more than the limit of %" PRId64 " elements", nm,
                shape_str(t->shape, t->ndim, sb, sizeof sb), lim->max_elements);
        return -1;
    }
    if (numel > lim->max_elements - *total) {
        set_err(err, nerr, "input '%s': the inputs have more than %" PRId64 " elements together", nm, lim->max_elements);
        return -1;
    }
    *total += numel;
    t->numel = numel;
    /* with the default limits this cannot overflow; a caller's huge max_elements might */
    if (__builtin_mul_overflow((size_t)numel, ems_dtype_size(t->dtype), &t->nbytes) || t->nbytes > (size_t)INT64_MAX) {
        set_err(err, nerr, "input '%s': shape %s of %s takes more bytes than can be addressed", nm,
                shape_str(t->shape, t->ndim, sb, sizeof sb), ems_dtype_name(t->dtype));
        return -1;
    }

    const json_t *params = json_object_get(in, "parameters");
    const json_t *bds = NULL;
    if (params) {
        if (!json_is_object(params)) {
            set_err(err, nerr, "input '%s': parameters is not an object", nm);
            return -1;
        }
        bds = json_object_get(params, "binary_data_size");
    }
    json_t *data = json_object_get(in, "data");
    if (data && bds) {
        set_err(err, nerr, "input '%s' has both data and binary_data_size", nm);
        return -1;
    }
    if (!data && !bds) {
        set_err(err, nerr, "input '%s' has neither data nor parameters.binary_data_size", nm);
        return -1;
    }
    if (bds) {
        if (!json_is_integer(bds) || json_integer_value(bds) < 0) {
            set_err(err, nerr, "input '%s': binary_data_size is not a non-negative integer", nm);
            return -1;
        }
        json_int_t b = json_integer_value(bds);
        if ((uint64_t)b != (uint64_t)t->nbytes) {
            set_err(err, nerr, "input '%s': binary_data_size is %lld but shape %s of %s takes %zu bytes", nm, (long long)b,
                    shape_str(t->shape, t->ndim, sb, sizeof sb), ems_dtype_name(t->dtype), t->nbytes);
            return -1;
        }
        p->bin_size = t->nbytes;
        return 0;
    }
    if (!json_is_array(data)) {
        set_err(err, nerr, "input '%s': data is not an array", nm);
        return -1;
    }
    int64_t n = data_count(data, 1, numel);
    if (n < 0) {
        set_err(err, nerr, "input '%s': data is nested deeper than %d levels", nm, DATA_MAX_DEPTH);
        return -1;
    }
    if (n != numel) {
        set_err(err, nerr, "input '%s': shape %s has %" PRId64 " elements but data has %s%" PRId64 " values", nm,
                shape_str(t->shape, t->ndim, sb, sizeof sb), numel, n > numel ? "more than " : "", n > numel ? numel : n);
        return -1;
    }
    p->data = data;
    return 0;
}

/* The request's "parameters" and "outputs". */
static int decode_request_extras(const json_t *root, ems_request *out, char *err, size_t nerr)
{
    const json_t *params = json_object_get(root, "parameters");
    if (params) {
        if (!json_is_object(params)) {
            set_err(err, nerr, "request parameters is not an object");
            return -1;
        }
        const json_t *b = json_object_get(params, "binary_data_output");
        if (b) {
            if (!json_is_boolean(b)) {
                set_err(err, nerr, "parameters.binary_data_output is not true or false");
                return -1;
            }
            out->binary_data_output = json_is_true(b);
        }
        const json_t *to = json_object_get(params, "timeout");
        if (to) {
            if (!json_is_integer(to) || json_integer_value(to) < 0) {
                set_err(err, nerr, "parameters.timeout is not a non-negative integer (microseconds)");
                return -1;
            }
            out->timeout_us = json_integer_value(to);
        }
    }
    const json_t *outs = json_object_get(root, "outputs");
    if (!outs) return 0;
    if (!json_is_array(outs)) {
        set_err(err, nerr, "outputs is not an array");
        return -1;
    }
    size_t n = json_array_size(outs);
    if (n == 0) return 0;
    if (n > (size_t)INT32_MAX) {
        set_err(err, nerr, "too many outputs");
        return -1;
    }
    json_t *seen = json_object();
    out->outputs = calloc(n, sizeof *out->outputs);
    if (!seen || !out->outputs) {
        json_decref(seen);
        set_err(err, nerr, "out of memory");
        return -1;
    }
    out->noutputs = (int)n;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        const json_t *o = json_array_get(outs, k);
        ems_output_request *r = &out->outputs[k];
        r->binary = -1;
        if (!json_is_object(o)) {
            set_err(err, nerr, "output %zu is not an object", k);
            rc = -1;
            break;
        }
        if (get_name(o, "output", (int)k, r->name, err, nerr)) {
            rc = -1;
            break;
        }
        if (json_object_get(seen, r->name)) {
            set_err(err, nerr, "output '%s' is requested twice", r->name);
            rc = -1;
            break;
        }
        if (json_object_set_new(seen, r->name, json_null())) {
            set_err(err, nerr, "out of memory");
            rc = -1;
            break;
        }
        const json_t *p = json_object_get(o, "parameters");
        if (!p) continue;
        if (!json_is_object(p)) {
            set_err(err, nerr, "output '%s': parameters is not an object", r->name);
            rc = -1;
            break;
        }
        const json_t *b = json_object_get(p, "binary_data");
        if (b) {
            if (!json_is_boolean(b)) {
                set_err(err, nerr, "output '%s': binary_data is not true or false", r->name);
                rc = -1;
                break;
            }
            r->binary = json_is_true(b) ? 1 : 0;
        }
    }
    json_decref(seen);
    return rc;
}

void ems_request_free(ems_request *r)
{
    if (!r) return;
    if (r->inputs)
        for (int i = 0; i < r->ninputs; i++) free(r->inputs[i].data);
    free(r->inputs);
    free(r->outputs);
    memset(r, 0, sizeof *r);
}

int ems_request_decode(const char *body, size_t len, int64_t header_len, const ems_limits *lim, ems_request *out, char *err,
                       size_t nerr)
{
    if (err && nerr) err[0] = '\0';
    if (!out) {
        set_err(err, nerr, "no request to decode into");
        return -1;
    }
    memset(out, 0, sizeof *out);
    ems_limits dl = ems_limits_default();
    if (!lim) lim = &dl;
    if (!body && len > 0) {
        set_err(err, nerr, "no request body");
        return -1;
    }
    size_t hl;
    if (header_len == -1) {
        hl = len;
    } else if (header_len < 0) {
        set_err(err, nerr, "Inference-Header-Content-Length is negative (%lld)", (long long)header_len);
        return -1;
    } else if ((uint64_t)header_len > (uint64_t)len) {
        set_err(err, nerr, "Inference-Header-Content-Length %lld is larger than the body (%zu bytes)", (long long)header_len, len);
        return -1;
    } else {
        hl = (size_t)header_len;
    }
    if (hl == 0) {
        set_err(err, nerr, "empty request: the JSON header has 0 bytes");
        return -1;
    }

    json_error_t jerr;
    json_t *root = json_loadb(body, hl, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        set_err(err, nerr, "the request is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        return -1;
    }
    json_t *seen = NULL;
    input_plan *plans = NULL;
    if (!json_is_object(root)) {
        set_err(err, nerr, "the request is not a JSON object");
        goto fail;
    }

    const json_t *id = json_object_get(root, "id");
    if (id) {
        if (!json_is_string(id)) {
            set_err(err, nerr, "id is not a string");
            goto fail;
        }
        size_t l = json_string_length(id);
        if (l >= EMS_ID_MAX) {
            set_err(err, nerr, "id is %zu bytes long, the longest allowed is %d", l, EMS_ID_MAX - 1);
            goto fail;
        }
        memcpy(out->id, json_string_value(id), l + 1);
        out->has_id = true;
    }

    const json_t *inputs = json_object_get(root, "inputs");
    if (!inputs) {
        set_err(err, nerr, "the request has no inputs");
        goto fail;
    }
    if (!json_is_array(inputs)) {
        set_err(err, nerr, "inputs is not an array");
        goto fail;
    }
    size_t nin = json_array_size(inputs);
    if (nin == 0) {
        set_err(err, nerr, "the request has no inputs (empty array)");
        goto fail;
    }
    if (nin > (size_t)(lim->max_inputs < 0 ? 0 : lim->max_inputs)) {
        set_err(err, nerr, "the request has %zu inputs, the most allowed is %d", nin, lim->max_inputs);
        goto fail;
    }

    /* pass 1: metadata, limits and the binary accounting; nothing large is allocated */
    out->inputs = calloc(nin, sizeof *out->inputs);
    plans = calloc(nin, sizeof *plans);
    seen = json_object();
    if (!out->inputs || !plans || !seen) {
        set_err(err, nerr, "out of memory");
        goto fail;
    }
    out->ninputs = (int)nin;
    int64_t total = 0;
    size_t bin_total = 0;
    bool any_binary = false;
    for (size_t k = 0; k < nin; k++) {
        if (plan_input(json_array_get(inputs, k), (int)k, lim, seen, &total, &out->inputs[k], &plans[k], err, nerr)) goto fail;
        if (!plans[k].data) {
            any_binary = true;
            plans[k].bin_offset = bin_total;
            if (__builtin_add_overflow(bin_total, plans[k].bin_size, &bin_total)) {
                set_err(err, nerr, "input '%s': the binary inputs take more bytes than can be addressed", out->inputs[k].name);
                goto fail;
            }
        }
    }
    size_t bin_len = len - hl;
    if (header_len == -1 && any_binary && bin_total > 0) {
        for (size_t k = 0; k < nin; k++)
            if (!plans[k].data) {
                set_err(err, nerr, "input '%s' has binary_data_size but the request has no Inference-Header-Content-Length",
                        out->inputs[k].name);
                break;
            }
        goto fail;
    }
    if (bin_total != bin_len) {
        set_err(err, nerr, "the binary inputs take %zu bytes but the body has %zu bytes after the %zu-byte JSON header", bin_total,
                bin_len, hl);
        goto fail;
    }
    if (decode_request_extras(root, out, err, nerr)) goto fail;

    /* pass 2: the tensors' memory */
    const unsigned char *bin = (const unsigned char *)body + hl;
    for (size_t k = 0; k < nin; k++) {
        ems_tensor *t = &out->inputs[k];
        if (t->numel == 0) continue;
        t->data = malloc(t->nbytes);
        if (!t->data) {
            set_err(err, nerr, "input '%s': out of memory for %zu bytes", t->name, t->nbytes);
            goto fail;
        }
        if (plans[k].data) {
            fill_ctx c = {.t = t, .idx = 0, .err = err, .nerr = nerr};
            if (fill_values(&c, plans[k].data)) goto fail;
        } else {
            const unsigned char *src = bin + plans[k].bin_offset;
            if (t->dtype == EMS_BOOL)
                for (size_t i = 0; i < t->nbytes; i++)
                    if (src[i] > 1) {
                        set_err(err, nerr, "input '%s': binary BOOL element %zu is %u, not 0 or 1", t->name, i, src[i]);
                        goto fail;
                    }
            memcpy(t->data, src, t->nbytes);
        }
    }
    free(plans);
    json_decref(seen);
    json_decref(root);
    return 0;

fail:
    free(plans);
    json_decref(seen);
    json_decref(root);
    ems_request_free(out);
    return -1;
}

/* ---- encoding --------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static bool sb_reserve(sbuf *b, size_t extra)
{
    if (b->oom) return false;
    if (extra <= b->cap - b->len) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void sb_put(sbuf *b, const void *s, size_t n)
{
    if (n == 0 || !sb_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* The length of a valid UTF-8 sequence at s (at most n bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t l;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) l = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) l = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) l = 4, cp = c & 0x07;
    else return 0;
    if (l > n) return 0;
    for (size_t i = 1; i < l; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return l;
}

/* A JSON string of at most @p max bytes of s (up to its NUL): quotes,
 * escapes, invalid UTF-8 as U+FFFD. */
static void sb_json_strn(sbuf *b, const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)(s ? s : "");
    size_t n = strnlen((const char *)u, max);
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            sb_printf(b, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            sb_put(b, &u[i], 1);
            i++;
        } else {
            size_t l = utf8_len(u + i, n - i);
            if (l) {
                sb_put(b, &u[i], l);
                i += l;
            } else {
                sb_str(b, "\\ufffd");
                i++;
            }
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_json_str(sbuf *b, const char *s) { sb_json_strn(b, s, SIZE_MAX); }

/* A finite double with @p digits significant digits, or null. Negative zero
 * prints as -0.0: "-0" would read back as the integer 0, losing the sign. */
static void sb_real(sbuf *b, double x, int digits)
{
    if (!isfinite(x)) sb_str(b, "null");
    else if (x == 0 && signbit(x)) sb_str(b, "-0.0");
    else sb_printf(b, "%.*g", digits, x);
}

static void sb_element(sbuf *b, const ems_tensor *t, int64_t i)
{
    const void *d = t->data;
    switch (t->dtype) {
    case EMS_BOOL: sb_str(b, ((const uint8_t *)d)[i] ? "true" : "false"); break;
    case EMS_UINT8: sb_printf(b, "%u", (unsigned)((const uint8_t *)d)[i]); break;
    case EMS_UINT16: sb_printf(b, "%u", (unsigned)((const uint16_t *)d)[i]); break;
    case EMS_UINT32: sb_printf(b, "%" PRIu32, ((const uint32_t *)d)[i]); break;
    case EMS_UINT64: sb_printf(b, "%" PRIu64, ((const uint64_t *)d)[i]); break;
    case EMS_INT8: sb_printf(b, "%d", (int)((const int8_t *)d)[i]); break;
    case EMS_INT16: sb_printf(b, "%d", (int)((const int16_t *)d)[i]); break;
    case EMS_INT32: sb_printf(b, "%" PRId32, ((const int32_t *)d)[i]); break;
    case EMS_INT64: sb_printf(b, "%" PRId64, ((const int64_t *)d)[i]); break;
    case EMS_FP16: sb_real(b, em_f16_bits_to_f32(((const uint16_t *)d)[i]), 5); break;
    case EMS_BF16: sb_real(b, em_bf16_bits_to_f32(((const uint16_t *)d)[i]), 4); break;
    case EMS_FP32: sb_real(b, ((const float *)d)[i], 9); break;
    case EMS_FP64: sb_real(b, ((const double *)d)[i], 17); break;
    default: sb_str(b, "null"); break;
    }
}

/* Beyond allocation failure, NULL also for what cannot be encoded: a NULL or
 * BYTES tensor, one with elements but no data, a bad rank. A NULL
 * model_name prints as "". */
char *ems_response_encode(const char *model_name, const char *model_version, const char *id, const ems_response_output *outs,
                          int nouts, size_t *len, int64_t *header_len)
{
    if (nouts < 0 || (nouts > 0 && !outs)) return NULL;
    for (int k = 0; k < nouts; k++) {
        const ems_tensor *t = outs[k].tensor;
        /* BYTES cannot be encoded; a tensor must carry its data */
        if (!t || ems_dtype_size(t->dtype) == 0 || t->numel < 0 || t->ndim < 0 || t->ndim > EMS_MAX_RANK ||
            (t->numel > 0 && !t->data) || (uint64_t)t->numel > SIZE_MAX / 8)
            return NULL;
    }
    sbuf b = {0};
    sb_str(&b, "{\"model_name\":");
    sb_json_str(&b, model_name);
    if (model_version) {
        sb_str(&b, ",\"model_version\":");
        sb_json_str(&b, model_version);
    }
    if (id) {
        sb_str(&b, ",\"id\":");
        sb_json_str(&b, id);
    }
    sb_str(&b, ",\"outputs\":[");
    bool any_binary = false;
    size_t bin_total = 0;
    for (int k = 0; k < nouts; k++) {
        const ems_tensor *t = outs[k].tensor;
        size_t nbytes = (size_t)t->numel * ems_dtype_size(t->dtype);
        if (outs[k].binary && __builtin_add_overflow(bin_total, nbytes, &bin_total)) b.oom = true;
        sb_str(&b, k ? ",{\"name\":" : "{\"name\":");
        sb_json_strn(&b, t->name, sizeof t->name);
        sb_str(&b, ",\"datatype\":\"");
        sb_str(&b, ems_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) sb_printf(&b, d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
        sb_str(&b, "]");
        if (outs[k].binary) {
            any_binary = true;
            sb_printf(&b, ",\"parameters\":{\"binary_data_size\":%zu}}", nbytes);
        } else {
            sb_str(&b, ",\"data\":[");
            for (int64_t i = 0; i < t->numel && !b.oom; i++) {
                if (i) sb_put(&b, ",", 1);
                sb_element(&b, t, i);
            }
            sb_str(&b, "]}");
        }
    }
    sb_str(&b, "]}");
    size_t json_len = b.len;
    if (any_binary && sb_reserve(&b, bin_total + 1))
        for (int k = 0; k < nouts; k++)
            if (outs[k].binary) {
                const ems_tensor *t = outs[k].tensor;
                sb_put(&b, t->data, (size_t)t->numel * ems_dtype_size(t->dtype));
            }
    if (!sb_reserve(&b, 1)) {
        free(b.p);
        return NULL;
    }
    b.p[b.len] = '\0'; /* handy for printing a JSON-only body; not counted */
    if (len) *len = b.len;
    if (header_len) *header_len = any_binary ? (int64_t)json_len : -1;
    return b.p;
}

char *ems_error_json(const char *msg, size_t *len)
{
    sbuf b = {0};
    sb_str(&b, "{\"error\":");
    sb_json_str(&b, msg);
    sb_str(&b, "}");
    if (!sb_reserve(&b, 1)) {
        free(b.p);
        return NULL;
    }
    b.p[b.len] = '\0';
    if (len) *len = b.len;
    return b.p;
}

/* ---- conversions ------------------------------------------------------------------ */

int ems_tensor_to_f32(const ems_tensor *t, float *dst)
{
    if (!t || ems_dtype_size(t->dtype) == 0) return -1;
    if (t->numel > 0 && (!t->data || !dst)) return -1;
    const void *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        float v;
        switch (t->dtype) {
        case EMS_BOOL: v = ((const uint8_t *)d)[i] ? 1.0f : 0.0f; break;
        case EMS_UINT8: v = (float)((const uint8_t *)d)[i]; break;
        case EMS_UINT16: v = (float)((const uint16_t *)d)[i]; break;
        case EMS_UINT32: v = (float)((const uint32_t *)d)[i]; break;
        case EMS_UINT64: v = (float)((const uint64_t *)d)[i]; break;
        case EMS_INT8: v = (float)((const int8_t *)d)[i]; break;
        case EMS_INT16: v = (float)((const int16_t *)d)[i]; break;
        case EMS_INT32: v = (float)((const int32_t *)d)[i]; break;
        case EMS_INT64: v = (float)((const int64_t *)d)[i]; break;
        case EMS_FP16: v = em_f16_bits_to_f32(((const uint16_t *)d)[i]); break;
        case EMS_BF16: v = em_bf16_bits_to_f32(((const uint16_t *)d)[i]); break;
        case EMS_FP32: v = ((const float *)d)[i]; break;
        default: v = (float)((const double *)d)[i]; break;
        }
        dst[i] = v;
    }
    return 0;
}

int ems_tensor_to_i64(const ems_tensor *t, int64_t *dst)
{
    if (!t || ems_dtype_size(t->dtype) == 0 || dtype_is_float(t->dtype)) return -1;
    if (t->numel > 0 && (!t->data || !dst)) return -1;
    const void *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t v;
        switch (t->dtype) {
        case EMS_BOOL: v = ((const uint8_t *)d)[i] ? 1 : 0; break;
        case EMS_UINT8: v = ((const uint8_t *)d)[i]; break;
        case EMS_UINT16: v = ((const uint16_t *)d)[i]; break;
        case EMS_UINT32: v = ((const uint32_t *)d)[i]; break;
        case EMS_UINT64:
            if (((const uint64_t *)d)[i] > (uint64_t)INT64_MAX) return -1;
            v = (int64_t)((const uint64_t *)d)[i];
            break;
        case EMS_INT8: v = ((const int8_t *)d)[i]; break;
        case EMS_INT16: v = ((const int16_t *)d)[i]; break;
        case EMS_INT32: v = ((const int32_t *)d)[i]; break;
        default: v = ((const int64_t *)d)[i]; break;
        }
        dst[i] = v;
    }
    return 0;
}
