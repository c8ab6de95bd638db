/* ONNX import: reading the model (protobuf-c over store/onnx.proto),
 * tensors, the graph check, the run loop and the helpers of
 * store/onnx_internal.h. The operators are in store/onnx_ops*.c.
 *
 * Format reference: the ONNX IR specification (onnx/docs/IR.md) and the
 * operator specification (onnx/docs/Operators.md), onnx 1.23.
 */
#define _GNU_SOURCE
#include "store/onnx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "store/onnx_load.c assumes a little-endian host (raw_data is little-endian)"
#endif

#define ONNX_MAX_FILE ((size_t)4 << 30)   /* protobuf's own limit is 2 GiB */
#define ONNX_MAX_DEPTH 48                 /* nesting of graphs / types in the file */
#define ONNX_MIN_OPSET 7
#define ONNX_MAX_OPSET 28

/* A loaded graph: the main graph or a subgraph (a GRAPH attribute of a node). */
struct onnx_graph {
    char *where;                   /* for load messages: the model's name, or the path to the subgraph */
    const char *attr;              /* a subgraph: the attribute holding it (run messages); main graph: NULL */
    /* values: every name of the graph gets an id */
    int nvalues;
    const char **vname;            /* borrowed from proto */
    onnx_value *init;              /* per value: initializer tensor (owned) or {NULL} */
    int *last_use;                 /* per value: last node reading it (inside its subgraphs too); INT_MAX for graph outputs */
    int ninputs, *input_id;
    const Onnx__ValueInfoProto **input_vi;
    int noutputs, *output_id;
    const Onnx__ValueInfoProto **output_vi;
    int nnodes;
    onnx_node *nodes;              /* in execution (topological) order */
    int ninit, *init_id;           /* initializer value ids in file order */
    /* names of enclosing graphs this subgraph reads: value cap_outer[j] of the
     * enclosing graph is value cap_local[j] here (main graph: none) */
    int ncap, *cap_outer, *cap_local;
};

struct em_onnx_model {
    char *name;
    char *base_dir;                /* external data folder; NULL: none allowed */
    Onnx__ModelProto *proto;
    int opset;
    onnx_graph g;                  /* the main graph */
    em_module *module;
};

/* ---- element types ---------------------------------------------------------------- */

static const char *const type_names[] = {
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
    "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1", "FLOAT8E8M0",
    "UINT2", "INT2",
};

const char *em_onnx_type_name(int t)
{
    if (t >= 0 && t < (int)(sizeof type_names / sizeof type_names[0])) return type_names[t];
    return "?";
}

bool onnx_type_to_dtype(int t, em_dtype *out)
{
    em_dtype d;
    switch (t) {
    case ONNX_FLOAT: d = EM_F32; break;
    case ONNX_FLOAT8E4M3FN: case ONNX_FLOAT8E4M3FNUZ: case ONNX_FLOAT8E5M2: case ONNX_FLOAT8E5M2FNUZ: d = EM_F32; break;
    case ONNX_FLOAT4E2M1: case ONNX_FLOAT8E8M0: d = EM_F32; break;
    case ONNX_DOUBLE: d = EM_F64; break;
    case ONNX_FLOAT16: d = EM_F16; break;
    case ONNX_BFLOAT16: d = EM_BF16; break;
    case ONNX_INT32: case ONNX_INT8: case ONNX_INT16: case ONNX_UINT16: d = EM_I32; break;
    case ONNX_INT4: case ONNX_UINT4: case ONNX_INT2: case ONNX_UINT2: d = EM_I32; break;
    case ONNX_INT64: case ONNX_UINT32: d = EM_I64; break;
    case ONNX_UINT8: d = EM_U8; break;
    case ONNX_BOOL: d = EM_BOOL; break;
    default: return false;
    }
    if (out) *out = d;
    return true;
}

int onnx_type_of_dtype(em_dtype dt)
{
    switch (dt) {
    case EM_F32: return ONNX_FLOAT;
    case EM_F64: return ONNX_DOUBLE;
    case EM_F16: return ONNX_FLOAT16;
    case EM_BF16: return ONNX_BFLOAT16;
    case EM_I32: return ONNX_INT32;
    case EM_I64: return ONNX_INT64;
    case EM_U8: return ONNX_UINT8;
    case EM_BOOL: return ONNX_BOOL;
    case EM_DTYPE_COUNT: break;
    }
    return ONNX_UNDEFINED;
}

/* Bytes per element in raw_data for the types Ember reads. */
static size_t raw_elem_size(int t)
{
    switch (t) {
    case ONNX_FLOAT: case ONNX_INT32: case ONNX_UINT32: return 4;
    case ONNX_DOUBLE: case ONNX_INT64: case ONNX_UINT64: return 8;
    case ONNX_FLOAT16: case ONNX_BFLOAT16: case ONNX_INT16: case ONNX_UINT16: return 2;
    case ONNX_INT8: case ONNX_UINT8: case ONNX_BOOL: return 1;
    case ONNX_FLOAT8E4M3FN: case ONNX_FLOAT8E4M3FNUZ: case ONNX_FLOAT8E5M2: case ONNX_FLOAT8E5M2FNUZ: case ONNX_FLOAT8E8M0: return 1;
    default: return 0;
    }
}

/* Bits per element of the sub-byte types, packed low bits first in raw_data
 * and int32_data (one byte per int32_data entry); 0 for the others. */
static int packed_bits(int t)
{
    switch (t) {
    case ONNX_INT4: case ONNX_UINT4: case ONNX_FLOAT4E2M1: return 4;
    case ONNX_INT2: case ONNX_UINT2: return 2;
    default: return 0;
    }
}

/* Element i of a packed sub-byte tensor whose byte holding it is @p byte,
 * sign-extended for INT4 / INT2. */
static int32_t packed_elem(int t, uint8_t byte, uint64_t i)
{
    int bits = packed_bits(t), per = 8 / bits;
    int32_t v = (byte >> ((int)(i % (uint64_t)per) * bits)) & ((1 << bits) - 1);
    if ((t == ONNX_INT4 || t == ONNX_INT2) && v >= 1 << (bits - 1)) v -= 1 << bits;
    return v;
}

/* The float8 value of bit pattern b (float8 types are held as EM_F32, exact):
 * E4M3FN has NaN at S.1111.111 and no inf; the FNUZ types their one NaN at
 * 0x80, no inf and no -0, exponent bias one more; E5M2 is IEEE-like. */
static float float8_value(int t, uint8_t b)
{
    const uint32_t nan_bits = 0x7fc00000u, inf_bits = 0x7f800000u;
    float nan, inf;
    memcpy(&nan, &nan_bits, 4);
    memcpy(&inf, &inf_bits, 4);
    if (t == ONNX_FLOAT8E8M0) {
        /* 2^(b - 127), NaN at 0xff: the f32 pattern b << 23 (2^-127, a subnormal, for 0) */
        uint32_t u = b == 0xff ? nan_bits : b ? (uint32_t)b << 23 : 0x00400000u;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    bool e5 = t == ONNX_FLOAT8E5M2 || t == ONNX_FLOAT8E5M2FNUZ;
    bool uz = t == ONNX_FLOAT8E4M3FNUZ || t == ONNX_FLOAT8E5M2FNUZ;
    int mb = e5 ? 2 : 3, bias = (e5 ? 15 : 7) + uz, emax = e5 ? 31 : 15;
    int e = (b & 0x7f) >> mb, m = b & ((1 << mb) - 1);
    float sg = b & 0x80 ? -1.0f : 1.0f;
    if (uz && b == 0x80) return nan;
    if (!uz && e == emax) {
        if (!e5 && m == (1 << mb) - 1) return nan;
        if (e5) return m ? nan : sg * inf;
    }
    /* the value is an integer below 16 times 2^k, k in [-17, 13]: exact in float */
    int k = e == 0 ? 1 - bias - mb : e - bias - mb;
    float v = (float)(e == 0 ? m : (1 << mb) + m);
    for (; k < 0; k++) v *= 0.5f;
    for (; k > 0; k--) v *= 2.0f;
    return sg * v;
}

static bool is_float8(int t) { return (t >= ONNX_FLOAT8E4M3FN && t <= ONNX_FLOAT8E5M2FNUZ) || t == ONNX_FLOAT8E8M0; }

/* ---- files ------------------------------------------------------------------------- */

/* Opens @p path for reading only when it is a regular file: O_NONBLOCK so
 * that a FIFO or device cannot block the open, O_NOFOLLOW when @p no_follow
 * (external data: a symlink could point out of the model's folder). NULL +
 * error otherwise. */
static FILE *open_regular(const char *path, bool no_follow)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (no_follow ? O_NOFOLLOW : 0));
    if (fd < 0) {
        if (no_follow && errno == ELOOP)
            em_set_error(EM_ERR_FORMAT, "%s: a symbolic link (external data must be a regular file inside the model's folder)", path);
        else
            em_set_error(EM_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        em_set_error(EM_ERR_IO, "%s: not a regular file", path);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        em_set_error(EM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    return f;
}

static em_status read_file(const char *path, size_t max, uint8_t **data, size_t *n)
{
    *data = NULL;
    *n = 0;
    FILE *f = open_regular(path, false);
    if (!f) return em_last_status();
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return em_set_error(EM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if ((uint64_t)sb.st_size > max) {
        fclose(f);
        return em_set_error(EM_ERR_FORMAT, "%s: %lld bytes is more than the %zu this reader takes", path,
                            (long long)sb.st_size, max);
    }
    size_t sz = (size_t)sb.st_size;
    uint8_t *buf = malloc(sz ? sz : 1);
    if (!buf) {
        fclose(f);
        return em_set_error(EM_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, sz);
    }
    if (sz && fread(buf, 1, sz, f) != sz) {
        free(buf);
        fclose(f);
        return em_set_error(EM_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    *data = buf;
    *n = sz;
    return EM_OK;
}

/* ---- nesting check ----------------------------------------------------------------
 * protobuf-c unpacks nested messages by recursion with no depth limit, so a
 * small file nesting graphs in attributes thousands deep would exhaust the
 * stack. This walk reads the wire format (varint keys, length-delimited
 * fields) and follows exactly the fields of store/onnx.proto that hold
 * messages which can nest, refusing more than ONNX_MAX_DEPTH levels. It also
 * rejects a malformed wire stream early with an offset. */

enum msg_kind { MK_NONE, MK_MODEL, MK_GRAPH, MK_NODE, MK_ATTR, MK_TYPE, MK_TYPE_INNER, MK_VALUE_INFO, MK_FUNCTION };

static enum msg_kind child_kind(enum msg_kind k, uint32_t field)
{
    switch (k) {
    case MK_MODEL: return field == 7 ? MK_GRAPH : field == 25 ? MK_FUNCTION : MK_NONE;
    case MK_FUNCTION: return field == 7 ? MK_NODE : field == 11 ? MK_ATTR : MK_NONE;
    case MK_GRAPH:
        if (field == 1) return MK_NODE;
        if (field == 11 || field == 12 || field == 13) return MK_VALUE_INFO;
        return MK_NONE;
    case MK_NODE: return field == 5 ? MK_ATTR : MK_NONE;
    case MK_ATTR:
        if (field == 6 || field == 11) return MK_GRAPH;
        if (field == 14 || field == 15) return MK_TYPE;
        return MK_NONE;
    case MK_VALUE_INFO: return field == 2 ? MK_TYPE : MK_NONE;
    case MK_TYPE: return (field == 4 || field == 5 || field == 9) ? MK_TYPE_INNER : MK_NONE;
    case MK_TYPE_INNER: return (field == 1 || field == 2) ? MK_TYPE : MK_NONE; /* Sequence/Optional 1, Map 2 */
    case MK_NONE: break;
    }
    return MK_NONE;
}

static bool read_varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= n) return false;
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

static em_status check_nesting(const char *name, const uint8_t *p, size_t n, size_t base, enum msg_kind k, int depth)
{
    if (depth > ONNX_MAX_DEPTH)
        return em_set_error(EM_ERR_FORMAT, "%s: messages nested more than %d deep (at byte %zu)", name, ONNX_MAX_DEPTH,
                            base);
    size_t pos = 0;
    while (pos < n) {
        uint64_t key, len;
        size_t at = pos;
        if (!read_varint(p, n, &pos, &key))
            return em_set_error(EM_ERR_FORMAT, "%s: truncated or corrupt protobuf (bad field key at byte %zu)", name,
                                base + at);
        uint32_t field = (uint32_t)(key >> 3), wt = (uint32_t)(key & 7);
        if (field == 0) return em_set_error(EM_ERR_FORMAT, "%s: corrupt protobuf (field 0 at byte %zu)", name, base + at);
        switch (wt) {
        case 0:
            if (!read_varint(p, n, &pos, &len))
                return em_set_error(EM_ERR_FORMAT, "%s: truncated protobuf (varint at byte %zu)", name, base + at);
            break;
        case 1:
            if (n - pos < 8) return em_set_error(EM_ERR_FORMAT, "%s: truncated protobuf (at byte %zu)", name, base + at);
            pos += 8;
            break;
        case 5:
            if (n - pos < 4) return em_set_error(EM_ERR_FORMAT, "%s: truncated protobuf (at byte %zu)", name, base + at);
            pos += 4;
            break;
        case 2: {
            if (!read_varint(p, n, &pos, &len) || len > n - pos)
                return em_set_error(EM_ERR_FORMAT, "%s: truncated protobuf (field %u at byte %zu claims more bytes than the file has)",
                                    name, field, base + at);
            enum msg_kind ck = child_kind(k, field);
            if (ck != MK_NONE) {
                em_status st = check_nesting(name, p + pos, (size_t)len, base + pos, ck, depth + 1);
                if (st != EM_OK) return st;
            }
            pos += (size_t)len;
            break;
        }
        default:
            return em_set_error(EM_ERR_FORMAT, "%s: corrupt protobuf (wire type %u at byte %zu)", name, wt, base + at);
        }
    }
    return EM_OK;
}

/* ---- tensors ----------------------------------------------------------------------- */

static bool safe_path(const char *loc)
{
    if (!loc || !*loc || loc[0] == '/') return false;
    const char *s = loc;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 2 && s[0] == '.' && s[1] == '.') return false;
        if (!e) break;
        s = e + 1;
    }
    return true;
}

/* Reads the external data of @p tp into a new buffer of exactly @p need bytes. */
static em_status read_external(const Onnx__TensorProto *tp, const char *base_dir, size_t need, uint8_t **out)
{
    const char *loc = NULL;
    uint64_t offset = 0, length = UINT64_MAX;
    const char *tn = tp->name ? tp->name : "";
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e->key) continue;
        char *end = NULL;
        if (!strcmp(e->key, "location")) loc = e->value;
        else if (!strcmp(e->key, "offset") && e->value) {
            errno = 0;
            offset = strtoull(e->value, &end, 10);
            if (errno || !end || *end) return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data offset '%s' is not a number", tn, e->value);
        } else if (!strcmp(e->key, "length") && e->value) {
            errno = 0;
            length = strtoull(e->value, &end, 10);
            if (errno || !end || *end) return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data length '%s' is not a number", tn, e->value);
        }
    }
    if (!loc) return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data without a location", tn);
    if (!base_dir) return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data '%s' but the model was loaded from memory", tn, loc);
    if (!safe_path(loc))
        return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data location '%s' must be a relative path inside the model's folder", tn, loc);
    if (length != UINT64_MAX && length != need)
        return em_set_error(EM_ERR_FORMAT, "tensor '%s': external data length %llu, its shape and type need %zu bytes", tn,
                            (unsigned long long)length, need);
    char *path = NULL;
    if (asprintf(&path, "%s/%s", base_dir, loc) < 0) return em_set_error(EM_ERR_NOMEM, "out of memory");
    /* a symlinked folder on the way must not lead out of the model's folder */
    char *rbase = realpath(base_dir, NULL), *rpath = realpath(path, NULL);
    bool inside = rbase && rpath && !strncmp(rpath, rbase, strlen(rbase)) && rpath[strlen(rbase)] == '/';
    free(rbase);
    free(rpath);
    if (!inside && access(path, F_OK) == 0) {
        em_status st = em_set_error(EM_ERR_FORMAT, "tensor '%s': external data %s resolves outside the model's folder", tn, path);
        free(path);
        return st;
    }
    FILE *f = open_regular(path, true);
    if (!f) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_status st = em_set_error(em_last_status(), "tensor '%s': external data %s", tn, msg);
        free(path);
        return st;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || (uint64_t)sb.st_size < offset ||
        (uint64_t)sb.st_size - offset < need) {
        fclose(f);
        em_status st = em_set_error(EM_ERR_FORMAT, "tensor '%s': external data %s is shorter than offset %llu + %zu bytes", tn,
                                    path, (unsigned long long)offset, need);
        free(path);
        return st;
    }
    uint8_t *buf = malloc(need ? need : 1);
    if (!buf) {
        fclose(f);
        free(path);
        return em_set_error(EM_ERR_NOMEM, "tensor '%s': cannot allocate %zu bytes", tn, need);
    }
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0 || (need && fread(buf, 1, need, f) != need)) {
        free(buf);
        fclose(f);
        em_status st = em_set_error(EM_ERR_IO, "tensor '%s': external data %s: short read", tn, path);
        free(path);
        return st;
    }
    fclose(f);
    free(path);
    *out = buf;
    return EM_OK;
}

em_tensor *onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *base_dir, int *type)
{
    const char *tn = tp->name ? tp->name : "";
    int t = tp->data_type;
    em_dtype dt;
    if (!onnx_type_to_dtype(t, &dt)) {
        em_set_error(EM_ERR_UNSUPPORTED, "tensor '%s': element type %s (%d) is not supported", tn, em_onnx_type_name(t), t);
        return NULL;
    }
    if (tp->n_dims > EM_MAX_DIMS) {
        em_set_error(EM_ERR_UNSUPPORTED, "tensor '%s': rank %zu is more than Ember's %d", tn, tp->n_dims, EM_MAX_DIMS);
        return NULL;
    }
    if (tp->segment) {
        em_set_error(EM_ERR_UNSUPPORTED, "tensor '%s': segmented tensors are not supported", tn);
        return NULL;
    }
    int64_t shape[EM_MAX_DIMS];
    uint64_t numel = 1;
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0) {
            em_set_error(EM_ERR_FORMAT, "tensor '%s': dim %zu is %lld", tn, i, (long long)tp->dims[i]);
            return NULL;
        }
        shape[i] = tp->dims[i];
        if (shape[i] && numel > ((uint64_t)1 << 40) / (uint64_t)shape[i]) {
            em_set_error(EM_ERR_FORMAT, "tensor '%s': %s elements is too many", tn, "2^40 or more");
            return NULL;
        }
        numel *= (uint64_t)shape[i];
    }
    size_t es = raw_elem_size(t);
    int pb = packed_bits(t);
    size_t need = pb ? ((size_t)numel * (size_t)pb + 7) / 8 : (size_t)numel * es;
    const uint8_t *raw = NULL;
    uint8_t *ext = NULL;
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        if (read_external(tp, base_dir, need, &ext) != EM_OK) return NULL;
        raw = ext;
    } else if (tp->has_raw_data) {
        if (tp->raw_data.len != need) {
            em_set_error(EM_ERR_FORMAT, "tensor '%s': raw_data has %zu bytes, %llu %s elements need %zu", tn, tp->raw_data.len,
                         (unsigned long long)numel, em_onnx_type_name(t), need);
            return NULL;
        }
        raw = tp->raw_data.data;
    }
    /* Typed fields: which one holds the values, and its count. */
    size_t have = 0;
    if (!raw) {
        switch (t) {
        case ONNX_FLOAT: have = tp->n_float_data; break;
        case ONNX_DOUBLE: have = tp->n_double_data; break;
        case ONNX_INT64: have = tp->n_int64_data; break;
        case ONNX_UINT32: case ONNX_UINT64: have = tp->n_uint64_data; break;
        default: have = tp->n_int32_data; break;
        }
        if (pb ? have != need : have != numel) {
            em_set_error(EM_ERR_FORMAT, "tensor '%s': %zu values for %llu elements of shape", tn, have, (unsigned long long)numel);
            return NULL;
        }
    }
    size_t esz = em_dtype_size(dt);
    uint8_t *buf = malloc(numel ? (size_t)numel * esz : 1);
    if (!buf) {
        free(ext);
        em_set_error(EM_ERR_NOMEM, "tensor '%s': cannot allocate %llu elements", tn, (unsigned long long)numel);
        return NULL;
    }
    for (uint64_t i = 0; i < numel; i++) {
        uint8_t *d = buf + i * esz;
        if (pb) {
            uint64_t k = i * (uint64_t)pb / 8;
            int32_t v = packed_elem(t, raw ? raw[k] : (uint8_t)tp->int32_data[k], i);
            if (t == ONNX_FLOAT4E2M1) {
                /* E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf, no NaN */
                static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
                float f = v & 8 ? -e2m1[v & 7] : e2m1[v & 7];
                memcpy(d, &f, 4);
            } else {
                memcpy(d, &v, 4);
            }
        } else if (is_float8(t)) {
            float v = float8_value(t, raw ? raw[i] : (uint8_t)tp->int32_data[i]);
            memcpy(d, &v, 4);
        } else if (raw) {
            const uint8_t *s = raw + i * es;
            switch (t) {
            case ONNX_INT8: { int32_t v = (int8_t)s[0]; memcpy(d, &v, 4); break; }
            case ONNX_INT16: { int16_t h; memcpy(&h, s, 2); int32_t v = h; memcpy(d, &v, 4); break; }
            case ONNX_UINT16: { uint16_t h; memcpy(&h, s, 2); int32_t v = h; memcpy(d, &v, 4); break; }
            case ONNX_UINT32: { uint32_t h; memcpy(&h, s, 4); int64_t v = h; memcpy(d, &v, 8); break; }
            case ONNX_BOOL: d[0] = s[0] != 0; break;
            default: memcpy(d, s, es); break;
            }
        } else {
            switch (t) {
            case ONNX_FLOAT: memcpy(d, &tp->float_data[i], 4); break;
            case ONNX_DOUBLE: memcpy(d, &tp->double_data[i], 8); break;
            case ONNX_INT64: memcpy(d, &tp->int64_data[i], 8); break;
            case ONNX_UINT32: { int64_t v = (uint32_t)tp->uint64_data[i]; memcpy(d, &v, 8); break; }
            case ONNX_INT32: memcpy(d, &tp->int32_data[i], 4); break;
            case ONNX_INT8: { int32_t v = (int8_t)tp->int32_data[i]; memcpy(d, &v, 4); break; }
            case ONNX_INT16: { int32_t v = (int16_t)tp->int32_data[i]; memcpy(d, &v, 4); break; }
            case ONNX_UINT16: { int32_t v = (uint16_t)tp->int32_data[i]; memcpy(d, &v, 4); break; }
            case ONNX_UINT8: d[0] = (uint8_t)tp->int32_data[i]; break;
            case ONNX_BOOL: d[0] = tp->int32_data[i] != 0; break;
            case ONNX_FLOAT16: case ONNX_BFLOAT16: { uint16_t h = (uint16_t)tp->int32_data[i]; memcpy(d, &h, 2); break; }
            default: break;
            }
        }
    }
    free(ext);
    em_tensor *out = em_from_host(buf, shape, (int)tp->n_dims, dt);
    free(buf);
    if (out && type) *type = t;
    return out;
}

em_tensor *em_onnx_read_tensor(const char *path, int *onnx_type)
{
    if (!path) {
        em_set_error(EM_ERR_INVALID, "em_onnx_read_tensor: path is NULL");
        return NULL;
    }
    uint8_t *data;
    size_t n;
    if (read_file(path, ONNX_MAX_FILE, &data, &n) != EM_OK) return NULL;
    if (check_nesting(path, data, n, 0, MK_NONE, 0) != EM_OK) {
        free(data);
        return NULL;
    }
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, n, data);
    free(data);
    if (!tp) {
        em_set_error(EM_ERR_FORMAT, "%s: not a serialized TensorProto (protobuf could not be parsed)", path);
        return NULL;
    }
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash) *slash = 0;
    em_tensor *t = onnx_tensor_from_proto(tp, slash ? dir : ".", onnx_type);
    if (!t && em_last_status() != EM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_set_error(em_last_status(), "%s: %s", path, msg);
    }
    free(dir);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return t;
}

/* ---- names -> value ids ------------------------------------------------------------ */

typedef struct name_map {
    size_t cap;
    const char **key;
    int *val;
} name_map;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool map_init(name_map *m, size_t n)
{
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->val = calloc(m->cap, sizeof *m->val);
    return m->key && m->val;
}

static void map_free(name_map *m)
{
    free(m->key);
    free(m->val);
}

/* Returns the id of @p s, adding it as @p next when new (then *added). */
static int map_get(name_map *m, const char *s, int next, bool *added)
{
    size_t i = hash_str(s) & (m->cap - 1);
    while (m->key[i]) {
        if (!strcmp(m->key[i], s)) {
            if (added) *added = false;
            return m->val[i];
        }
        i = (i + 1) & (m->cap - 1);
    }
    if (next < 0) return -1;
    m->key[i] = s;
    m->val[i] = next;
    if (added) *added = true;
    return next;
}

/* ---- operator lookup ------------------------------------------------------------- */

static const onnx_op *const op_tables[] = {onnx_ops_core, onnx_ops_elementwise, onnx_ops_shape, onnx_ops_nn, onnx_ops_vision,
                                             onnx_ops_rnn, onnx_ops_control};

/* The entry with the newest `since` <= opset; *oldest: the oldest since seen for the name (0: none). */
static const onnx_op *find_op(const char *op_type, int opset, int *oldest)
{
    const onnx_op *best = NULL;
    *oldest = 0;
    for (size_t t = 0; t < sizeof op_tables / sizeof op_tables[0]; t++)
        for (const onnx_op *o = op_tables[t]; o->name; o++) {
            if (strcmp(o->name, op_type)) continue;
            if (!*oldest || o->since < *oldest) *oldest = o->since;
            if (o->since <= opset && (!best || o->since > best->since)) best = o;
        }
    return best;
}

const onnx_op *onnx_find_op(const char *op_type, int opset)
{
    int oldest;
    return find_op(op_type, opset, &oldest);
}

/* ---- the module holding the initializers ------------------------------------------ */

static em_tensor *onnx_module_forward(em_module *mod, const em_tensor *x)
{
    em_onnx_model *m = em_module_impl(mod);
    if (m->g.ninputs != 1 || m->g.noutputs < 1) {
        em_set_error(EM_ERR_INVALID, "%s: em_module_forward needs a model of one input (this one has %d inputs, %d outputs); use em_onnx_run",
                     m->name, m->g.ninputs, m->g.noutputs);
        return NULL;
    }
    em_tensor *in = (em_tensor *)x, *out = NULL;
    if (em_onnx_run(m, &in, 1, &out, 1) != EM_OK) return NULL;
    /* a module's forward follows tensor.h's rules (the current scope owns the
     * result): a view made here is scope-owned, our own reference is dropped */
    em_tensor *r = em_reshape(out, em_tensor_shape(out), em_tensor_ndim(out));
    em_tensor_release(out);
    return r;
}

static const em_module_vtable ONNX_MODEL_VT = {"OnnxModel", onnx_module_forward, NULL};
static const em_module_vtable ONNX_NS_VT = {"OnnxNamespace", NULL, NULL};

/* Registers @p t under @p key ("a.b.c" -> child a, child b, parameter c). */
static em_status register_init(em_module *root, const char *key, em_tensor *t)
{
    bool is_param = em_dtype_is_float(em_tensor_dtype(t));
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", key);
    /* empty segments ("a..b", ".x", "x.") cannot be module names */
    bool ok = buf[0] && buf[0] != '.' && buf[strlen(buf) - 1] != '.' && !strstr(buf, "..");
    em_module *m = root;
    char *seg = buf;
    if (ok) {
        char *dot;
        while ((dot = strchr(seg, '.'))) {
            *dot = 0;
            em_module *c = em_module_get_child(m, seg);
            if (!c) {
                c = em_module_new(&ONNX_NS_VT, NULL);
                if (!c || em_module_add_child(m, seg, c) != EM_OK) {
                    ok = false;
                    break;
                }
            }
            m = c;
            seg = dot + 1;
        }
    }
    if (ok && (is_param ? em_module_add_param(m, seg, t) : em_module_add_buffer(m, seg, t)) == EM_OK) return EM_OK;
    /* A name that cannot be a key path: flattened at the root, dots as '_'. */
    em_clear_error();
    snprintf(buf, sizeof buf, "%s", key[0] ? key : "_");
    for (char *p = buf; *p; p++)
        if (*p == '.') *p = '_';
    if ((is_param ? em_module_add_param(root, buf, t) : em_module_add_buffer(root, buf, t)) == EM_OK) return EM_OK;
    em_clear_error();
    return EM_OK; /* not reachable by key; the graph still uses the tensor */
}

/* ---- load ------------------------------------------------------------------------- */

static void graph_clear(onnx_graph *g)
{
    if (g->init)
        for (int i = 0; i < g->nvalues; i++) em_tensor_release(g->init[i].t);
    if (g->nodes)
        for (int i = 0; i < g->nnodes; i++) {
            onnx_node *n = &g->nodes[i];
            free(n->in);
            free(n->out);
            free(n->impl);
            if (n->sub)
                for (size_t a = 0; a < n->p->n_attribute; a++)
                    if (n->sub[a]) {
                        graph_clear(n->sub[a]);
                        free(n->sub[a]);
                    }
            free(n->sub);
        }
    free(g->nodes);
    free(g->init);
    free(g->vname);
    free(g->last_use);
    free(g->input_id);
    free(g->input_vi);
    free(g->output_id);
    free(g->output_vi);
    free(g->init_id);
    free(g->cap_outer);
    free(g->cap_local);
    free(g->where);
    memset(g, 0, sizeof *g);
}

void em_onnx_free(em_onnx_model *m)
{
    if (!m) return;
    graph_clear(&m->g);
    em_module_free(m->module);
    if (m->proto) onnx__model_proto__free_unpacked(m->proto, NULL);
    free(m->name);
    free(m->base_dir);
    free(m);
}

/* Upper bound of the names a graph can hold: its own, and those its
 * subgraphs (at any depth) may read from it. Saturates past INT_MAX. */
static size_t graph_names(const Onnx__GraphProto *gp)
{
    size_t n = gp->n_initializer + gp->n_input + gp->n_output + 1;
    for (size_t i = 0; i < gp->n_node && n <= (size_t)INT_MAX; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        n += np->n_input + np->n_output;
        for (size_t a = 0; a < np->n_attribute && n <= (size_t)INT_MAX; a++) {
            if (np->attribute[a]->g) n += graph_names(np->attribute[a]->g);
            for (size_t j = 0; j < np->attribute[a]->n_graphs && n <= (size_t)INT_MAX; j++)
                n += graph_names(np->attribute[a]->graphs[j]);
        }
    }
    return n;
}

/* The graph being built, and the enclosing ones (lexical scopes). */
typedef struct build_scope {
    struct build_scope *parent;
    em_onnx_model *m;
    onnx_graph *g;
    name_map map;
    bool *defined;
    int *producer;
} build_scope;

/* Id of @p nm in @p s, adding it when new. */
static int scope_value(build_scope *s, const char *nm)
{
    bool added;
    int id = map_get(&s->map, nm, s->g->nvalues, &added);
    if (added) s->g->vname[s->g->nvalues++] = nm;
    return id;
}

/* Id of the value named @p nm as seen from @p s: defined there, or defined
 * in an enclosing graph (then captured into s, and into every graph
 * between). -1 when no graph in scope defines it. */
static int scope_resolve(build_scope *s, const char *nm)
{
    int id = map_get(&s->map, nm, -1, NULL);
    if (id >= 0 && s->defined[id]) return id;
    if (!s->parent) return -1;
    int pid = scope_resolve(s->parent, nm);
    if (pid < 0) return -1;
    if (id < 0) id = scope_value(s, nm);
    s->defined[id] = true;
    s->producer[id] = -1;
    s->g->cap_outer[s->g->ncap] = pid;
    s->g->cap_local[s->g->ncap++] = id;
    return id;
}

/* Refuses a value type of a graph input or output Ember cannot hold. The
 * main graph's inputs must declare a tensor type of an element type Ember
 * holds; a subgraph's inputs and outputs may leave their type out. */
static em_status check_value_type(const char *where, const char *what, const Onnx__ValueInfoProto *vi, bool main_input,
                                  bool in_sub)
{
    if (!vi->type || (in_sub && vi->type->value_case == ONNX__TYPE_PROTO__VALUE__NOT_SET)) {
        if (!main_input) return EM_OK;
    }
    if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return em_set_error(EM_ERR_UNSUPPORTED, "%s: %s '%s' is not a tensor (sequences, maps and optionals are not supported)",
                            where, what, vi->name);
    const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
    if ((main_input || tt->has_elem_type) && !onnx_type_to_dtype(tt->elem_type, NULL))
        return em_set_error(EM_ERR_UNSUPPORTED, "%s: %s '%s' has element type %s, which Ember does not hold", where, what,
                            vi->name, em_onnx_type_name(tt->elem_type));
    return EM_OK;
}

/* Builds @p s->g from @p gp: the main graph (s->parent NULL) or a subgraph
 * whose names not defined inside resolve to the enclosing graphs'. */
static em_status build_graph(build_scope *s, const Onnx__GraphProto *gp)
{
    em_onnx_model *m = s->m;
    onnx_graph *G = s->g;
    const char *mn = G->where;
    bool is_main = !s->parent;
    if (gp->n_sparse_initializer) return em_set_error(EM_ERR_UNSUPPORTED, "%s: sparse initializers are not supported", mn);
    size_t cap = graph_names(gp);
    if (cap > (size_t)INT_MAX / 4) return em_set_error(EM_ERR_FORMAT, "%s: graph too large", mn);
    if (!map_init(&s->map, cap)) {
        map_free(&s->map);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    G->vname = calloc(cap, sizeof *G->vname);
    G->init = calloc(cap, sizeof *G->init);
    G->last_use = calloc(cap, sizeof *G->last_use);
    G->init_id = calloc(gp->n_initializer + 1, sizeof *G->init_id);
    G->input_id = calloc(gp->n_input + 1, sizeof *G->input_id);
    G->input_vi = calloc(gp->n_input + 1, sizeof *G->input_vi);
    G->output_id = calloc(gp->n_output + 1, sizeof *G->output_id);
    G->output_vi = calloc(gp->n_output + 1, sizeof *G->output_vi);
    G->cap_outer = calloc(cap, sizeof *G->cap_outer);
    G->cap_local = calloc(cap, sizeof *G->cap_local);
    G->nodes = calloc(gp->n_node + 1, sizeof *G->nodes);
    s->defined = calloc(cap, 1);
    s->producer = calloc(cap, sizeof *s->producer);
    bool *defined = s->defined;
    int *producer = s->producer;
    em_status st = EM_OK;
    if (!G->vname || !G->init || !G->last_use || !G->init_id || !G->input_id || !G->input_vi || !G->output_id ||
        !G->output_vi || !G->nodes || !G->cap_outer || !G->cap_local || !defined || !producer) {
        st = em_set_error(EM_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* initializers */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        if (!tp->name || !*tp->name) {
            st = em_set_error(EM_ERR_FORMAT, "%s: initializer %zu has no name", mn, i);
            goto out;
        }
        int id = scope_value(s, tp->name);
        if (defined[id]) {
            st = em_set_error(EM_ERR_FORMAT, "%s: initializer '%s' is defined twice", mn, tp->name);
            goto out;
        }
        int type = 0;
        em_tensor *t = onnx_tensor_from_proto(tp, m->base_dir, &type);
        if (!t) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            st = em_set_error(em_last_status() ? em_last_status() : EM_ERR_FORMAT, "%s: initializer: %s", mn, msg);
            goto out;
        }
        G->init[id].t = t;
        G->init[id].type = type;
        defined[id] = true;
        producer[id] = -1;
        G->init_id[G->ninit++] = id;
    }
    /* graph inputs (those that are initializers too are defaults, not inputs) */
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi->name || !*vi->name) {
            st = em_set_error(EM_ERR_FORMAT, "%s: graph input %zu has no name", mn, i);
            goto out;
        }
        int id = scope_value(s, vi->name);
        if (defined[id] && G->init[id].t) continue;
        if (defined[id]) {
            st = em_set_error(EM_ERR_FORMAT, "%s: graph input '%s' is declared twice", mn, vi->name);
            goto out;
        }
        if ((st = check_value_type(mn, "graph input", vi, is_main, !is_main)) != EM_OK) goto out;
        defined[id] = true;
        producer[id] = -1;
        G->input_vi[G->ninputs] = vi;
        G->input_id[G->ninputs++] = id;
    }
    /* nodes: ids of their inputs and outputs */
    int nn = (int)gp->n_node;
    for (int k = 0; k < nn; k++) {
        const Onnx__NodeProto *np = gp->node[k];
        onnx_node *n = &G->nodes[k];
        n->p = np;
        G->nnodes = k + 1; /* freed from here on */
        char nname[160];
        if (np->name && *np->name) snprintf(nname, sizeof nname, "'%s'", np->name);
        else snprintf(nname, sizeof nname, "#%d (unnamed)", k);
        const char *opt = np->op_type ? np->op_type : "";
        const char *dom = np->domain ? np->domain : "";
        if (*dom && strcmp(dom, "ai.onnx")) {
            st = em_set_error(EM_ERR_UNSUPPORTED, "%s: node %s (%s): domain '%s' is not supported (only the default ai.onnx)",
                              mn, nname, opt, dom);
            goto out;
        }
        int oldest = 0;
        n->op = find_op(opt, m->opset, &oldest);
        n->opset = m->opset;
        if (!n->op) {
            if (oldest)
                st = em_set_error(EM_ERR_UNSUPPORTED, "%s: node %s (%s, opset %d): Ember implements %s from opset %d", mn, nname,
                                  opt, m->opset, opt, oldest);
            else
                st = em_set_error(EM_ERR_UNSUPPORTED, "%s: node %s (%s, opset %d): operator %s is not supported", mn, nname, opt,
                                  m->opset, opt);
            goto out;
        }
        n->nin = (int)np->n_input;
        n->nout = (int)np->n_output;
        n->in = malloc(sizeof(int) * (size_t)(n->nin + 1));
        n->out = malloc(sizeof(int) * (size_t)(n->nout + 1));
        if (!n->in || !n->out) {
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int i = 0; i < n->nin; i++) {
            if (!np->input[i] || !*np->input[i]) n->in[i] = -1;
            else n->in[i] = scope_value(s, np->input[i]);
        }
        for (int i = 0; i < n->nout; i++) {
            if (!np->output[i] || !*np->output[i]) {
                n->out[i] = -1;
                continue;
            }
            int id = scope_value(s, np->output[i]);
            if (defined[id]) {
                st = em_set_error(EM_ERR_FORMAT, "%s: node %s (%s): output '%s' is already defined (graphs are SSA)", mn, nname,
                                  opt, np->output[i]);
                goto out;
            }
            defined[id] = true;
            producer[id] = k;
            n->out[i] = id;
        }
    }
    /* every input must be defined, here or (in a subgraph) in an enclosing graph */
    for (int k = 0; k < nn; k++)
        for (int i = 0; i < G->nodes[k].nin; i++) {
            int id = G->nodes[k].in[i];
            if (id >= 0 && !defined[id] && scope_resolve(s, G->vname[id]) < 0) {
                st = em_set_error(EM_ERR_FORMAT, "%s: node #%d '%s' (%s): input '%s' is not produced by any node, input or initializer%s",
                                  mn, k, G->nodes[k].p->name ? G->nodes[k].p->name : "", G->nodes[k].p->op_type, G->vname[id],
                                  is_main ? "" : " of this graph or an enclosing one");
                goto out;
            }
        }
    /* subgraphs (GRAPH attributes); the outer values they read become the node's implicit inputs */
    for (int k = 0; k < nn; k++) {
        onnx_node *n = &G->nodes[k];
        const Onnx__NodeProto *np = n->p;
        for (size_t a = 0; a < np->n_attribute; a++) {
            const Onnx__AttributeProto *at = np->attribute[a];
            if (at->n_graphs) {
                st = em_set_error(EM_ERR_UNSUPPORTED, "%s: node #%d '%s' (%s): GRAPHS attribute '%s' is not supported", mn, k,
                                  np->name ? np->name : "", np->op_type, at->name ? at->name : "");
                goto out;
            }
            if (!at->g) continue;
            if (!n->sub && !(n->sub = calloc(np->n_attribute, sizeof *n->sub))) {
                st = em_set_error(EM_ERR_NOMEM, "out of memory");
                goto out;
            }
            onnx_graph *sg = calloc(1, sizeof *sg);
            if (!sg) {
                st = em_set_error(EM_ERR_NOMEM, "out of memory");
                goto out;
            }
            n->sub[a] = sg;
            sg->attr = at->name ? at->name : "";
            char nname[160];
            if (np->name && *np->name) snprintf(nname, sizeof nname, "'%s'", np->name);
            else snprintf(nname, sizeof nname, "#%d (unnamed)", k);
            if (asprintf(&sg->where, "%s: node %s (%s): graph '%s'", mn, nname, np->op_type, at->name ? at->name : "") < 0) {
                sg->where = NULL;
                st = em_set_error(EM_ERR_NOMEM, "out of memory");
                goto out;
            }
            build_scope cs = {s, m, sg, {0, NULL, NULL}, NULL, NULL};
            st = build_graph(&cs, at->g);
            if (st != EM_OK) goto out;
            if (sg->ncap) {
                int *ni = realloc(n->impl, sizeof(int) * (size_t)(n->nimpl + sg->ncap));
                if (!ni) {
                    st = em_set_error(EM_ERR_NOMEM, "out of memory");
                    goto out;
                }
                n->impl = ni;
                for (int j = 0; j < sg->ncap; j++) n->impl[n->nimpl++] = sg->cap_outer[j];
            }
        }
    }
    /* topological order (Kahn); ONNX requires sorted graphs, but a cycle must be an error */
    {
        int *order = calloc((size_t)nn + 1, sizeof(int));
        bool *done = calloc(cap, 1);
        bool *placed = calloc((size_t)nn + 1, 1);
        if (!order || !done || !placed) {
            free(order);
            free(done);
            free(placed);
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int v = 0; v < G->nvalues; v++) done[v] = defined[v] && producer[v] < 0;
        int no = 0;
        bool progress = true;
        /* repeated passes keep file order among ready nodes; O(n) for sorted graphs */
        while (no < nn && progress) {
            progress = false;
            for (int k = 0; k < nn; k++) {
                if (placed[k]) continue;
                const onnx_node *n = &G->nodes[k];
                bool ready = true;
                for (int i = 0; i < n->nin && ready; i++)
                    if (n->in[i] >= 0 && !done[n->in[i]]) ready = false;
                for (int i = 0; i < n->nimpl && ready; i++)
                    if (!done[n->impl[i]]) ready = false;
                if (!ready) continue;
                placed[k] = true;
                order[no++] = k;
                for (int i = 0; i < n->nout; i++)
                    if (n->out[i] >= 0) done[n->out[i]] = true;
                progress = true;
            }
        }
        if (no < nn) {
            int k = 0;
            while (placed[k]) k++;
            st = em_set_error(EM_ERR_FORMAT, "%s: the graph has a cycle (node #%d '%s' (%s) depends on its own output)", mn,
                              k, G->nodes[k].p->name ? G->nodes[k].p->name : "", G->nodes[k].p->op_type);
            free(order);
            free(done);
            free(placed);
            goto out;
        }
        onnx_node *sorted = calloc((size_t)nn + 1, sizeof *sorted);
        if (!sorted) {
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
        } else {
            for (int k = 0; k < nn; k++) sorted[k] = G->nodes[order[k]];
            free(G->nodes);
            G->nodes = sorted;
        }
        free(order);
        free(done);
        free(placed);
        if (st != EM_OK) goto out;
    }
    /* outputs (a subgraph's output may be a value of an enclosing graph) */
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        int id = vi->name ? map_get(&s->map, vi->name, -1, NULL) : -1;
        if ((id < 0 || !defined[id]) && vi->name && *vi->name) id = scope_resolve(s, vi->name);
        if (id < 0 || !defined[id]) {
            st = em_set_error(EM_ERR_FORMAT, "%s: graph output '%s' is not produced by the graph", mn, vi->name ? vi->name : "");
            goto out;
        }
        if (vi->type && (st = check_value_type(mn, "graph output", vi, false, !is_main)) != EM_OK) goto out;
        G->output_vi[G->noutputs] = vi;
        G->output_id[G->noutputs++] = id;
    }
    /* last uses: release intermediates as soon as possible (a node's
     * subgraphs' reads of this graph's values count as its uses) */
    for (int v = 0; v < G->nvalues; v++) G->last_use[v] = -1;
    for (int k = 0; k < nn; k++) {
        const onnx_node *n = &G->nodes[k];
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] >= 0) G->last_use[n->in[i]] = k;
        for (int i = 0; i < n->nimpl; i++) G->last_use[n->impl[i]] = k;
    }
    for (int i = 0; i < G->noutputs; i++) G->last_use[G->output_id[i]] = INT_MAX;
out:
    free(s->defined);
    free(s->producer);
    s->defined = NULL;
    s->producer = NULL;
    map_free(&s->map);
    return st;
}

/* The main graph. */
static em_status build_main(em_onnx_model *m)
{
    const Onnx__GraphProto *g = m->proto->graph;
    const char *mn = m->name;
    if (!g) return em_set_error(EM_ERR_FORMAT, "%s: the model has no graph", mn);
    if (m->proto->n_functions)
        return em_set_error(EM_ERR_UNSUPPORTED, "%s: model-local functions (%zu, first '%s') are not supported", mn,
                            m->proto->n_functions, m->proto->functions[0]->name ? m->proto->functions[0]->name : "");
    m->g.where = strdup(mn);
    if (!m->g.where) return em_set_error(EM_ERR_NOMEM, "out of memory");
    build_scope s = {NULL, m, &m->g, {0, NULL, NULL}, NULL, NULL};
    return build_graph(&s, g);
}

static em_onnx_model *load_bytes(const uint8_t *data, size_t n, const char *base_dir, const char *name)
{
    if (check_nesting(name, data, n, 0, MK_MODEL, 0) != EM_OK) return NULL;
    em_onnx_model *m = calloc(1, sizeof *m);
    if (!m) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->name = strdup(name);
    m->base_dir = base_dir ? strdup(base_dir) : NULL;
    m->proto = onnx__model_proto__unpack(NULL, n, data);
    if (!m->name || (base_dir && !m->base_dir)) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        em_onnx_free(m);
        return NULL;
    }
    if (!m->proto) {
        em_set_error(EM_ERR_FORMAT, "%s: not an ONNX model (protobuf could not be parsed)", name);
        em_onnx_free(m);
        return NULL;
    }
    if (m->proto->ir_version < 3) {
        em_set_error(m->proto->ir_version <= 0 ? EM_ERR_FORMAT : EM_ERR_UNSUPPORTED,
                     "%s: IR version %lld is not supported (3 or later; is this an ONNX file?)", name,
                     (long long)m->proto->ir_version);
        em_onnx_free(m);
        return NULL;
    }
    int opset = -1;
    for (size_t i = 0; i < m->proto->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->proto->opset_import[i];
        if (!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) opset = (int)o->version;
    }
    /* No default-domain opset: only nodes of other domains (refused below
     * as unsupported); a default-domain node then is a format error. */
    bool any_default = false;
    for (size_t i = 0; m->proto->graph && i < m->proto->graph->n_node; i++) {
        const char *dom = m->proto->graph->node[i]->domain;
        if (!dom || !*dom || !strcmp(dom, "ai.onnx")) any_default = true;
    }
    if (opset < 0 && any_default) {
        em_set_error(EM_ERR_FORMAT, "%s: the model imports no opset of the default domain", name);
        em_onnx_free(m);
        return NULL;
    }
    if (opset >= 0 && (opset < ONNX_MIN_OPSET || opset > ONNX_MAX_OPSET)) {
        em_set_error(EM_ERR_UNSUPPORTED, "%s: opset %d is not supported (%d to %d)", name, opset, ONNX_MIN_OPSET, ONNX_MAX_OPSET);
        em_onnx_free(m);
        return NULL;
    }
    m->opset = opset;
    if (build_main(m) != EM_OK) {
        em_onnx_free(m);
        return NULL;
    }
    m->module = em_module_new(&ONNX_MODEL_VT, m);
    if (!m->module) {
        em_onnx_free(m);
        return NULL;
    }
    for (int i = 0; i < m->g.ninit; i++) register_init(m->module, m->g.vname[m->g.init_id[i]], m->g.init[m->g.init_id[i]].t);
    return m;
}

em_onnx_model *em_onnx_load_memory(const void *data, size_t n, const char *base_dir, const char *name, const char **err)
{
    em_onnx_model *m = NULL;
    if (!data && n) em_set_error(EM_ERR_INVALID, "em_onnx_load_memory: data is NULL");
    else m = load_bytes(data, n, base_dir, name ? name : "(memory)");
    if (!m && err) *err = em_last_error();
    return m;
}

em_onnx_model *em_onnx_load(const char *path, const char **err)
{
    em_onnx_model *m = NULL;
    uint8_t *data = NULL;
    size_t n = 0;
    if (!path) em_set_error(EM_ERR_INVALID, "em_onnx_load: path is NULL");
    else if (read_file(path, ONNX_MAX_FILE, &data, &n) == EM_OK) {
        char *dir = strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = 0;
        m = load_bytes(data, n, slash ? dir : ".", path);
        free(dir);
        free(data);
    }
    if (!m && err) *err = em_last_error();
    return m;
}

/* ---- accessors ---------------------------------------------------------------------- */

int em_onnx_num_inputs(const em_onnx_model *m) { return m ? m->g.ninputs : 0; }
int em_onnx_num_outputs(const em_onnx_model *m) { return m ? m->g.noutputs : 0; }
int em_onnx_opset(const em_onnx_model *m) { return m ? m->opset : 0; }
em_module *em_onnx_module(em_onnx_model *m) { return m ? m->module : NULL; }
int em_onnx_num_initializers(const em_onnx_model *m) { return m ? m->g.ninit : 0; }

const char *em_onnx_input_name(const em_onnx_model *m, int i)
{
    return m && i >= 0 && i < m->g.ninputs ? m->g.vname[m->g.input_id[i]] : NULL;
}

const char *em_onnx_output_name(const em_onnx_model *m, int i)
{
    return m && i >= 0 && i < m->g.noutputs ? m->g.vname[m->g.output_id[i]] : NULL;
}

const char *em_onnx_initializer_name(const em_onnx_model *m, int i)
{
    return m && i >= 0 && i < m->g.ninit ? m->g.vname[m->g.init_id[i]] : NULL;
}

em_tensor *em_onnx_initializer(const em_onnx_model *m, int i)
{
    return m && i >= 0 && i < m->g.ninit ? m->g.init[m->g.init_id[i]].t : NULL;
}

int em_onnx_input_shape(const em_onnx_model *m, int i, int64_t *shape)
{
    if (!m || i < 0 || i >= m->g.ninputs) return -1;
    const Onnx__TypeProto__Tensor *tt = m->g.input_vi[i]->type->tensor_type;
    if (!tt->shape) return -1;
    int r = (int)tt->shape->n_dim;
    for (int d = 0; d < r && d < EM_MAX_DIMS; d++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[d];
        shape[d] = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ? dm->dim_value : -1;
    }
    return r;
}

em_dtype em_onnx_input_dtype(const em_onnx_model *m, int i)
{
    em_dtype dt = EM_F32;
    if (m && i >= 0 && i < m->g.ninputs) onnx_type_to_dtype(m->g.input_vi[i]->type->tensor_type->elem_type, &dt);
    return dt;
}

int em_onnx_output_type(const em_onnx_model *m, int i)
{
    if (!m || i < 0 || i >= m->g.noutputs) return 0;
    const Onnx__TypeProto *tp = m->g.output_vi[i]->type;
    return tp && tp->tensor_type && tp->tensor_type->has_elem_type ? tp->tensor_type->elem_type : 0;
}

/* ---- run ------------------------------------------------------------------------------ */

static void node_error(const onnx_graph *g, const onnx_node *n)
{
    char msg[768], label[160];
    em_status st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_RUNTIME;
    snprintf(msg, sizeof msg, "%s", em_last_status() != EM_OK ? em_last_error() : "failed without a message");
    if (n->p->name && *n->p->name) snprintf(label, sizeof label, "'%s'", n->p->name);
    else snprintf(label, sizeof label, "#%d (unnamed)", (int)(n - g->nodes));
    /* a subgraph's failure is wrapped by the node owning it: its graph is named relatively */
    if (g->attr) em_set_error(st, "graph '%s': node %s (%s): %s", g->attr, label, n->p->op_type, msg);
    else em_set_error(st, "%s: node %s (%s, opset %d): %s", g->where, label, n->p->op_type, n->opset, msg);
}

/* Runs the nodes of @p g over its values @p v (initializers, inputs and
 * captured outer values set); values are released after their last use. */
static em_status exec_graph(em_onnx_model *m, const onnx_graph *g, onnx_value *v)
{
    for (int k = 0; k < g->nnodes; k++) {
        const onnx_node *n = &g->nodes[k];
        onnx_value inv[64], outv[64];
        if (n->nin > 64 || n->nout > 64) {
            em_set_error(EM_ERR_UNSUPPORTED, "more than 64 inputs or outputs");
            node_error(g, n);
            return em_last_status();
        }
        for (int i = 0; i < n->nin; i++) inv[i] = n->in[i] >= 0 ? v[n->in[i]] : (onnx_value){NULL, 0};
        memset(outv, 0, sizeof(onnx_value) * (size_t)(n->nout + 1));
        onnx_ctx c = {m, n, n->opset, n->nin, inv, n->nout, outv, g, v};
        em_clear_error();
        em_scope_begin();
        em_status st = n->op->fn(&c);
        if (st == EM_OK)
            for (int i = 0; i < n->nout; i++) {
                if (n->out[i] < 0) continue;
                if (!outv[i].t) {
                    st = em_set_error(EM_ERR_RUNTIME, "output %d ('%s') was not computed", i, g->vname[n->out[i]]);
                    break;
                }
            }
        for (int i = 0; i < n->nout; i++)
            if (outv[i].t) em_tensor_retain(outv[i].t);
        em_scope_end();
        if (st != EM_OK) {
            for (int i = 0; i < n->nout; i++) em_tensor_release(outv[i].t);
            node_error(g, n);
            return em_last_status();
        }
        for (int i = 0; i < n->nout; i++) {
            if (n->out[i] < 0) em_tensor_release(outv[i].t);
            else v[n->out[i]] = outv[i];
        }
        for (int i = 0; i < n->nin + n->nimpl; i++) {
            int id = i < n->nin ? n->in[i] : n->impl[i - n->nin];
            if (id >= 0 && g->last_use[id] == k && v[id].t) {
                em_tensor_release(v[id].t);
                v[id].t = NULL;
            }
        }
    }
    return EM_OK;
}

em_status em_onnx_run(em_onnx_model *m, em_tensor *const inputs[], int nin, em_tensor *outputs[], int nout)
{
    if (!m) return em_set_error(EM_ERR_INVALID, "em_onnx_run: model is NULL");
    const onnx_graph *g = &m->g;
    if (nin != g->ninputs)
        return em_set_error(EM_ERR_INVALID, "%s: %d inputs given, the model has %d", m->name, nin, g->ninputs);
    if (nout < 0 || nout > g->noutputs)
        return em_set_error(EM_ERR_INVALID, "%s: %d outputs asked for, the model has %d", m->name, nout, g->noutputs);
    if (nout && !outputs) return em_set_error(EM_ERR_INVALID, "em_onnx_run: outputs is NULL");
    onnx_value *v = calloc((size_t)g->nvalues + 1, sizeof *v);
    if (!v) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_status st = EM_OK;
    for (int i = 0; i < g->nvalues; i++)
        if (g->init[i].t) v[i] = (onnx_value){em_tensor_retain(g->init[i].t), g->init[i].type};
    for (int i = 0; i < nin; i++) {
        int id = g->input_id[i];
        const char *nm = g->vname[id];
        int et = g->input_vi[i]->type->tensor_type->elem_type;
        em_dtype want;
        onnx_type_to_dtype(et, &want);
        if (!inputs || !inputs[i]) {
            if (g->last_use[id] < 0) continue;
            st = em_set_error(EM_ERR_INVALID, "%s: input '%s' is NULL", m->name, nm);
            goto out;
        }
        if (em_tensor_dtype(inputs[i]) != want) {
            st = em_set_error(EM_ERR_DTYPE, "%s: input '%s' is %s, the model declares %s (Ember %s)", m->name, nm,
                              em_dtype_name(em_tensor_dtype(inputs[i])), em_onnx_type_name(et), em_dtype_name(want));
            goto out;
        }
        int64_t shape[EM_MAX_DIMS];
        int r = em_onnx_input_shape(m, i, shape);
        if (r >= 0) {
            bool ok = r == em_tensor_ndim(inputs[i]);
            for (int d = 0; ok && d < r; d++)
                if (shape[d] >= 0 && shape[d] != em_tensor_dim(inputs[i], d)) ok = false;
            if (!ok) {
                char a[128], b[128];
                st = em_set_error(EM_ERR_SHAPE, "%s: input '%s' has shape %s, the model declares %s (-1 = any)", m->name, nm,
                                  em_shape_str(em_tensor_shape(inputs[i]), em_tensor_ndim(inputs[i]), a, sizeof a),
                                  em_shape_str(shape, r < EM_MAX_DIMS ? r : EM_MAX_DIMS, b, sizeof b));
                goto out;
            }
        }
        em_tensor_release(v[id].t); /* an input overriding an initializer's default */
        v[id] = (onnx_value){em_tensor_retain(inputs[i]), et};
    }
    st = exec_graph(m, g, v);
    if (st == EM_OK)
        for (int i = 0; i < nout; i++) outputs[i] = em_tensor_retain(v[g->output_id[i]].t);
out:
    for (int i = 0; i < g->nvalues; i++) em_tensor_release(v[i].t);
    free(v);
    return st;
}

/* ---- subgraphs ------------------------------------------------------------------------ */

static const onnx_graph *subgraph_of(onnx_ctx *c, const char *attr_name)
{
    const Onnx__NodeProto *p = c->node->p;
    if (c->node->sub)
        for (size_t a = 0; a < p->n_attribute; a++)
            if (c->node->sub[a] && p->attribute[a]->name && !strcmp(p->attribute[a]->name, attr_name)) return c->node->sub[a];
    em_set_error(EM_ERR_FORMAT, "graph attribute '%s' is missing", attr_name);
    return NULL;
}

em_status onnx_subgraph_arity(onnx_ctx *c, const char *attr_name, int *nin, int *nout)
{
    const onnx_graph *sg = subgraph_of(c, attr_name);
    if (!sg) return em_last_status();
    if (nin) *nin = sg->ninputs;
    if (nout) *nout = sg->noutputs;
    return EM_OK;
}

em_status onnx_run_subgraph(onnx_ctx *c, const char *attr_name, int nin, const onnx_value *in, int nout, onnx_value *out)
{
    for (int i = 0; i < nout; i++) out[i] = (onnx_value){NULL, 0};
    const onnx_graph *sg = subgraph_of(c, attr_name);
    if (!sg) return em_last_status();
    if (nin != sg->ninputs)
        return em_set_error(EM_ERR_FORMAT, "graph '%s' has %d inputs, %d given", attr_name, sg->ninputs, nin);
    if (nout > sg->noutputs)
        return em_set_error(EM_ERR_FORMAT, "graph '%s' has %d outputs, %d asked for", attr_name, sg->noutputs, nout);
    onnx_value *v = calloc((size_t)sg->nvalues + 1, sizeof *v);
    if (!v) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_status st = EM_OK;
    for (int i = 0; i < sg->nvalues; i++)
        if (sg->init[i].t) v[i] = (onnx_value){em_tensor_retain(sg->init[i].t), sg->init[i].type};
    for (int j = 0; j < sg->ncap; j++) {
        const onnx_value *ov = &c->values[sg->cap_outer[j]];
        if (!ov->t) {
            st = em_set_error(EM_ERR_RUNTIME, "graph '%s': outer value '%s' is not available", attr_name,
                              sg->vname[sg->cap_local[j]]);
            goto out;
        }
        v[sg->cap_local[j]] = (onnx_value){em_tensor_retain(ov->t), ov->type};
    }
    for (int i = 0; i < nin; i++) {
        int id = sg->input_id[i];
        if (!in[i].t) {
            st = em_set_error(EM_ERR_INVALID, "graph '%s': input '%s' is not given", attr_name, sg->vname[id]);
            goto out;
        }
        em_tensor_release(v[id].t);
        v[id] = (onnx_value){em_tensor_retain(in[i].t), in[i].type};
    }
    st = exec_graph(c->model, sg, v);
    if (st == EM_OK)
        for (int i = 0; i < nout; i++) {
            const onnx_value *ov = &v[sg->output_id[i]];
            if (!ov->t) {
                st = em_set_error(EM_ERR_RUNTIME, "graph '%s': output '%s' was not computed", attr_name,
                                  sg->vname[sg->output_id[i]]);
                break;
            }
            /* a view: a new reference owned by the current (the op's) scope */
            out[i] = (onnx_value){em_reshape(ov->t, em_tensor_shape(ov->t), em_tensor_ndim(ov->t)), ov->type};
            if (!out[i].t) {
                st = em_last_status();
                break;
            }
        }
out:
    for (int i = 0; i < sg->nvalues; i++) em_tensor_release(v[i].t);
    free(v);
    return st;
}

/* ---- helpers for the operators -------------------------------------------------------- */

em_tensor *onnx_in(onnx_ctx *c, int i) { return i >= 0 && i < c->nin ? c->in[i].t : NULL; }

int onnx_in_type(onnx_ctx *c, int i) { return i >= 0 && i < c->nin && c->in[i].t ? c->in[i].type : 0; }

em_tensor *onnx_in_req(onnx_ctx *c, int i)
{
    em_tensor *t = onnx_in(c, i);
    if (!t) em_set_error(EM_ERR_FORMAT, "input %d is required", i);
    return t;
}

int onnx_in_ints(onnx_ctx *c, int i, int64_t *buf, int max)
{
    em_tensor *t = onnx_in_req(c, i);
    if (!t) return -1;
    em_dtype dt = em_tensor_dtype(t);
    if (dt != EM_I64 && dt != EM_I32) {
        em_set_error(EM_ERR_DTYPE, "input %d must be int64 or int32, not %s", i, em_dtype_name(dt));
        return -1;
    }
    if (em_tensor_ndim(t) > 1) {
        em_set_error(EM_ERR_SHAPE, "input %d must be a scalar or 1-D, it has rank %d", i, em_tensor_ndim(t));
        return -1;
    }
    int64_t n = em_tensor_numel(t);
    if (n > max) {
        em_set_error(EM_ERR_SHAPE, "input %d has %lld values, at most %d are allowed", i, (long long)n, max);
        return -1;
    }
    if (n == 0) return 0;
    em_tensor *t64 = dt == EM_I64 ? em_contiguous(t) : em_cast(t, EM_I64);
    if (!t64 || em_to_host(t64, buf, (size_t)n * 8) != EM_OK) return -1;
    return (int)n;
}

em_status onnx_in_scalar(onnx_ctx *c, int i, double *v)
{
    em_tensor *t = onnx_in_req(c, i);
    if (!t) return em_last_status();
    if (em_tensor_numel(t) != 1) return em_set_error(EM_ERR_SHAPE, "input %d must have one element, it has %lld", i, (long long)em_tensor_numel(t));
    return em_item(t, v);
}

const Onnx__AttributeProto *onnx_attr(onnx_ctx *c, const char *name)
{
    const Onnx__NodeProto *p = c->node->p;
    for (size_t i = 0; i < p->n_attribute; i++)
        if (p->attribute[i]->name && !strcmp(p->attribute[i]->name, name)) return p->attribute[i];
    return NULL;
}

bool onnx_has_attr(onnx_ctx *c, const char *name) { return onnx_attr(c, name) != NULL; }

int64_t onnx_attr_int(onnx_ctx *c, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    return a && a->has_i ? a->i : def;
}

double onnx_attr_float(onnx_ctx *c, const char *name, double def)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    return a && a->has_f ? (double)a->f : def;
}

const char *onnx_attr_string(onnx_ctx *c, const char *name, const char *def)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a || !a->has_s) return def;
    /* protobuf-c's bytes are not NUL-terminated: the value is copied into
     * a thread-local ring of 8 slots of 255 characters (attribute strings
     * are short mode names), valid until 8 more calls. */
    static __thread char ring[8][256];
    static __thread int next;
    char *b = ring[next++ & 7];
    size_t n = a->s.len < 255 ? a->s.len : 255;
    memcpy(b, a->s.data, n);
    b[n] = 0;
    return b;
}

int onnx_attr_ints(onnx_ctx *c, const char *name, const int64_t **v)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a) return -1;
    *v = a->ints;
    return (int)a->n_ints;
}

int onnx_attr_floats(onnx_ctx *c, const char *name, const float **v)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a) return -1;
    *v = a->floats;
    return (int)a->n_floats;
}

em_tensor *onnx_attr_tensor(onnx_ctx *c, const char *name, int *type)
{
    const Onnx__AttributeProto *a = onnx_attr(c, name);
    if (!a || !a->t) return NULL;
    return onnx_tensor_from_proto(a->t, c->model->base_dir, type);
}

em_status onnx_out(onnx_ctx *c, int i, em_tensor *t, int type)
{
    if (!t) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_RUNTIME, "output %d is NULL", i);
    if (i < 0 || i >= c->nout) return EM_OK;
    if (!type) {
        if (c->nin > 0 && c->in[0].t && em_tensor_dtype(c->in[0].t) == em_tensor_dtype(t)) type = c->in[0].type;
        else type = onnx_type_of_dtype(em_tensor_dtype(t));
    }
    c->out[i].t = t;
    c->out[i].type = type;
    return EM_OK;
}

em_status onnx_unsupported(onnx_ctx *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return em_set_error(EM_ERR_UNSUPPORTED, "%s", msg);
}

em_status onnx_axis(onnx_ctx *c, int64_t axis, int rank, int *out)
{
    (void)c;
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= (rank > 0 ? rank : 1))
        return em_set_error(EM_ERR_INVALID, "axis %lld is out of range for rank %d", (long long)axis, rank);
    *out = (int)a;
    return EM_OK;
}

bool onnx_int_range(int type, double *lo, double *hi)
{
    double l, h;
    switch (type) {
    case ONNX_BOOL: l = 0, h = 1; break;
    case ONNX_UINT2: l = 0, h = 3; break;
    case ONNX_INT2: l = -2, h = 1; break;
    case ONNX_UINT4: l = 0, h = 15; break;
    case ONNX_INT4: l = -8, h = 7; break;
    case ONNX_UINT8: l = 0, h = 255; break;
    case ONNX_INT8: l = -128, h = 127; break;
    case ONNX_UINT16: l = 0, h = 65535; break;
    case ONNX_INT16: l = -32768, h = 32767; break;
    case ONNX_INT32: l = -2147483648.0, h = 2147483647.0; break;
    case ONNX_UINT32: l = 0, h = 4294967295.0; break;
    case ONNX_INT64: l = -9223372036854775808.0, h = 9223372036854775807.0; break;
    default: return false;
    }
    *lo = l;
    *hi = h;
    return true;
}

em_tensor *onnx_wrap_int(em_tensor *t, int type)
{
    double span, lo;
    switch (type) {
    case ONNX_INT8: span = 256, lo = -128; break;
    case ONNX_INT16: span = 65536, lo = -32768; break;
    case ONNX_UINT16: span = 65536, lo = 0; break;
    case ONNX_UINT32: span = 4294967296.0, lo = 0; break;
    case ONNX_INT4: span = 16, lo = -8; break;
    case ONNX_UINT4: span = 16, lo = 0; break;
    case ONNX_INT2: span = 4, lo = -2; break;
    case ONNX_UINT2: span = 4, lo = 0; break;
    default: return t;
    }
    /* ((x - lo) mod span) + lo with a floor modulo: the two's-complement wrap */
    em_tensor *a = em_sub_scalar(t, lo);
    em_tensor *b = em_remainder_scalar(a, span);
    em_tensor *r = em_add_scalar(b, lo);
    return r && em_tensor_dtype(r) != em_tensor_dtype(t) ? em_cast(r, em_tensor_dtype(t)) : r;
}
