/* SafeTensors read / write / load-into-model, with jansson for the header.
 * Format: https://github.com/huggingface/safetensors (see ember/store.h). */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/store.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "store/safetensors.c assumes a little-endian host"
#endif

/* ---- dtypes ------------------------------------------------------------------- */

typedef struct st_dtype_info {
    const char *name;
    em_dtype dt; /* EM_DTYPE_COUNT: no Ember equivalent */
    unsigned bits; /* bits per element (F4 and F6_* are sub-byte) */
} st_dtype_info;

/* Every dtype of the reference crate (safetensors 0.8), in its enum order:
 * the writer lays tensors out by this order, descending, then by name. */
static const st_dtype_info st_dtypes[] = {
    {"BOOL", EM_BOOL, 8},
    {"F4", EM_DTYPE_COUNT, 4},
    {"F6_E2M3", EM_DTYPE_COUNT, 6},
    {"F6_E3M2", EM_DTYPE_COUNT, 6},
    {"U8", EM_U8, 8},
    {"I8", EM_DTYPE_COUNT, 8},
    {"F8_E5M2", EM_DTYPE_COUNT, 8},
    {"F8_E4M3", EM_DTYPE_COUNT, 8},
    {"F8_E8M0", EM_DTYPE_COUNT, 8},
    {"F8_E4M3FNUZ", EM_DTYPE_COUNT, 8},
    {"F8_E5M2FNUZ", EM_DTYPE_COUNT, 8},
    {"I16", EM_DTYPE_COUNT, 16},
    {"U16", EM_DTYPE_COUNT, 16},
    {"F16", EM_F16, 16},
    {"BF16", EM_BF16, 16},
    {"I32", EM_I32, 32},
    {"U32", EM_DTYPE_COUNT, 32},
    {"F32", EM_F32, 32},
    {"C64", EM_DTYPE_COUNT, 64},
    {"F64", EM_F64, 64},
    {"I64", EM_I64, 64},
    {"U64", EM_DTYPE_COUNT, 64},
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

static const st_dtype_info *st_dtype_lookup(const char *s)
{
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, s) == 0) return &st_dtypes[i];
    return NULL;
}

/* Position of Ember dtype dt in the crate's order, -1 if it has none. */
static int st_dtype_rank(em_dtype dt)
{
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].dt == dt && dt != EM_DTYPE_COUNT) return (int)i;
    return -1;
}

const char *em_safetensors_dtype_str(em_dtype dt)
{
    int r = st_dtype_rank(dt);
    return r < 0 ? NULL : st_dtypes[r].name;
}

/* ---- the open file ------------------------------------------------------------ */

struct em_st_file {
    char *path;
    uint8_t *buf; /* byte buffer (64-byte aligned), owned */
    size_t buflen;
    em_st_tensor *tensors; /* sorted by name */
    void **copies;         /* per tensor: aligned copy when the file's data was misaligned, else NULL */
    size_t n;
    em_st_kv *meta;
    size_t nmeta;
};

void em_safetensors_close(em_st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) {
        free((char *)f->tensors[i].name);
        if (f->copies) free(f->copies[i]);
    }
    for (size_t i = 0; i < f->nmeta; i++) {
        free((char *)f->meta[i].key);
        free((char *)f->meta[i].value);
    }
    free(f->tensors);
    free(f->copies);
    free(f->meta);
    free(f->buf);
    free(f->path);
    free(f);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const em_st_tensor *)a)->name, ((const em_st_tensor *)b)->name);
}

static void *aligned_buf(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) return NULL;
    return p;
}

/* What validation needs of an entry beyond em_st_tensor. */
typedef struct st_aux {
    size_t rank;        /* rank in the file (may exceed EM_MAX_DIMS) */
    bool overflow;      /* numel or its bit count overflows u64 (the crate's ValidationOverflow) */
    bool partial_byte;  /* a sub-byte dtype whose elements do not fill whole bytes */
    uint64_t need;      /* bytes the shape and dtype need */
    const st_dtype_info *di;
} st_aux;

/* Parses one tensor entry's fields and types; the checks across entries
 * (offsets, sizes) come after, in offset order, as the reference crate's
 * validate(). Returns EM_OK or an error naming file and key. */
static em_status parse_entry(const char *file, const char *key, json_t *v, em_st_tensor *t, st_aux *aux)
{
    if (!json_is_object(v)) return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", file, key);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"", file, key);
    const st_dtype_info *di = st_dtype_lookup(json_string_value(jd));
    if (!di)
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.40s\"", file, key,
                             json_string_value(jd));
    if (!json_is_array(js)) return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': missing or non-list \"shape\"", file, key);
    size_t nd = json_array_size(js);
    /* numel folded left to right with overflow checks, as the crate does */
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': shape entry %zu is not an integer >= 0", file, key, i);
        uint64_t s = (uint64_t)json_integer_value(d);
        if (i < EM_MAX_DIMS) t->shape[i] = (int64_t)s;
        if (!overflow && s && numel > UINT64_MAX / s) overflow = true;
        else if (!overflow) numel *= s;
    }
    if (!overflow && numel > UINT64_MAX / di->bits) overflow = true;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is not [begin, end]", file, key);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': bad data_offsets [%lld, %lld]", file, key, (long long)b,
                             (long long)e);
    aux->rank = nd;
    aux->overflow = overflow;
    aux->partial_byte = !overflow && (numel * di->bits) % 8 != 0;
    aux->need = overflow ? 0 : numel * di->bits / 8;
    aux->di = di;
    t->dtype = di->dt;
    t->st_dtype = di->name;
    t->elem_size = di->bits % 8 ? 0 : di->bits / 8;
    t->ndim = nd > EM_MAX_DIMS ? EM_MAX_DIMS : (int)nd;
    t->numel = overflow || numel > INT64_MAX ? -1 : (int64_t)numel;
    t->nbytes = (size_t)aux->need;
    t->data_begin = (uint64_t)b;
    t->data_end = (uint64_t)e;
    return EM_OK;
}

/* The crate's validate() and buffer check over the entries sorted by
 * offsets: contiguous from 0 (no hole, no overlap), sizes that match shape
 * and dtype, the last end at the end of the buffer; then Ember's rank limit. */
static em_status validate_layout(const char *file, em_st_tensor *tensors, const st_aux *aux, size_t n, size_t buflen)
{
    size_t *by = malloc((n ? n : 1) * sizeof *by);
    if (!by) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++) by[i] = i;
    /* insertion sort by (begin, end): stable and headers are small */
    for (size_t i = 1; i < n; i++) {
        size_t k = by[i], j = i;
        while (j > 0 && (tensors[by[j - 1]].data_begin > tensors[k].data_begin ||
                         (tensors[by[j - 1]].data_begin == tensors[k].data_begin &&
                          tensors[by[j - 1]].data_end > tensors[k].data_end))) {
            by[j] = by[j - 1];
            j--;
        }
        by[j] = k;
    }
    em_status st = EM_OK;
    uint64_t start = 0;
    const em_st_tensor *prev = NULL;
    for (size_t r = 0; r < n && st == EM_OK; r++) {
        const em_st_tensor *t = &tensors[by[r]];
        const st_aux *x = &aux[by[r]];
        char sh[160];
        if (t->data_begin > start) {
            st = em__set_error(EM_ERR_FORMAT,
                               "%s: tensor '%s': bytes [%llu, %llu) of the data buffer belong to no tensor (data_offsets "
                               "[%llu, %llu])",
                               file, t->name, (unsigned long long)start, (unsigned long long)t->data_begin,
                               (unsigned long long)t->data_begin, (unsigned long long)t->data_end);
        } else if (t->data_begin < start) {
            st = em__set_error(EM_ERR_FORMAT, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", file,
                               prev->name, (unsigned long long)prev->data_begin, (unsigned long long)prev->data_end,
                               t->name, (unsigned long long)t->data_begin, (unsigned long long)t->data_end);
        } else if (x->overflow) {
            if (x->rank <= EM_MAX_DIMS) em_shape_str(t->shape, t->ndim, sh, sizeof sh);
            else snprintf(sh, sizeof sh, "of rank %zu", x->rank);
            st = em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': shape %s of %s overflows", file, t->name, sh,
                               x->di->name);
        } else if (x->partial_byte) {
            st = em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': %lld elements of %s do not fill whole bytes", file,
                               t->name, (long long)t->numel, x->di->name);
        } else if (t->data_end - t->data_begin != x->need) {
            if (x->rank <= EM_MAX_DIMS) em_shape_str(t->shape, t->ndim, sh, sizeof sh);
            else snprintf(sh, sizeof sh, "of rank %zu", x->rank);
            st = em__set_error(EM_ERR_FORMAT,
                               "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                               file, t->name, sh, x->di->name, (unsigned long long)x->need,
                               (unsigned long long)t->data_begin, (unsigned long long)t->data_end,
                               (unsigned long long)(t->data_end - t->data_begin));
        }
        start = t->data_end;
        prev = t;
    }
    if (st == EM_OK && start > buflen)
        st = em__set_error(EM_ERR_FORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] beyond the %zu-byte data buffer (file truncated?)",
                           file, prev->name, (unsigned long long)prev->data_begin, (unsigned long long)prev->data_end,
                           buflen);
    if (st == EM_OK && start < buflen) {
        if (prev)
            st = em__set_error(EM_ERR_FORMAT,
                               "%s: %llu bytes after the end of the last tensor's data ('%s' ends at %llu of the %zu-byte "
                               "data buffer)",
                               file, (unsigned long long)(buflen - start), prev->name, (unsigned long long)start, buflen);
        else
            st = em__set_error(EM_ERR_FORMAT, "%s: %zu bytes of data after a header that lists no tensor", file, buflen);
    }
    for (size_t i = 0; i < n && st == EM_OK; i++)
        if (aux[i].rank > EM_MAX_DIMS)
            st = em__set_error(EM_ERR_UNSUPPORTED, "%s: tensor '%s': rank %zu above Ember's limit of %d dimensions", file,
                               tensors[i].name, aux[i].rank, EM_MAX_DIMS);
    free(by);
    return st;
}

/* Offset of the first byte that breaks UTF-8 in s[0..n), or n when valid
 * (no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_bad_at(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t min, cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) len = 2, min = 0x80, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) len = 3, min = 0x800, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) len = 4, min = 0x10000, cp = c & 0x07;
        else return i;
        if (i + len > n) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* Builds the file object from a header and an owned, aligned byte buffer
 * (freed on failure). */
static em_st_file *st_build(const char *file, const char *hdr, size_t hlen, uint8_t *buf, size_t buflen)
{
    em_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(file))) {
        free(f);
        free(buf);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory", file);
    }
    f->buf = buf;
    f->buflen = buflen;
    st_aux *aux = NULL;
    size_t bad = utf8_bad_at((const uint8_t *)hdr, hlen);
    if (bad < hlen) {
        em__set_error(EM_ERR_FORMAT, "%s: header is not valid UTF-8 (header byte %zu is 0x%02x)", file, bad,
                      (unsigned)(uint8_t)hdr[bad]);
        em_safetensors_close(f);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        em__set_error(EM_ERR_FORMAT, "%s: header is not valid JSON: %s (header byte %d)", file, jerr.text,
                      jerr.position);
        goto fail;
    }
    if (!json_is_object(root)) {
        em__set_error(EM_ERR_FORMAT, "%s: header is JSON but not an object", file);
        goto fail;
    }
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    f->copies = calloc(cap ? cap : 1, sizeof *f->copies);
    aux = calloc(cap ? cap : 1, sizeof *aux);
    if (!f->tensors || !f->copies || !aux) {
        em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (json_is_null(val)) continue;
            if (!json_is_object(val)) {
                em__set_error(EM_ERR_FORMAT, "%s: __metadata__ is not an object", file);
                goto fail;
            }
            size_t nm = json_object_size(val);
            f->meta = calloc(nm ? nm : 1, sizeof *f->meta);
            if (!f->meta) {
                em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv)) {
                    em__set_error(EM_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string", file, mk);
                    goto fail;
                }
                em_st_kv *kv = &f->meta[f->nmeta];
                kv->key = strdup(mk);
                kv->value = strdup(json_string_value(mv));
                f->nmeta++;
                if (!kv->key || !kv->value) {
                    em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
                    goto fail;
                }
            }
            continue;
        }
        em_st_tensor *t = &f->tensors[f->n];
        if (parse_entry(file, key, val, t, &aux[f->n]) != EM_OK) goto fail;
        t->name = strdup(key);
        f->n++;
        if (!t->name) {
            em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
            goto fail;
        }
    }
    json_decref(root);
    root = NULL;

    if (validate_layout(file, f->tensors, aux, f->n, buflen) != EM_OK) goto fail;
    free(aux);
    aux = NULL;
    qsort(f->tensors, f->n, sizeof *f->tensors, cmp_tensor_name);
    for (size_t i = 0; i < f->n; i++) {
        em_st_tensor *t = &f->tensors[i];
        const uint8_t *p = f->buf + t->data_begin;
        if (t->elem_size > 1 && (uintptr_t)p % t->elem_size != 0) {
            f->copies[i] = aligned_buf(t->nbytes);
            if (!f->copies[i]) {
                em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
                goto fail;
            }
            memcpy(f->copies[i], p, t->nbytes);
            p = f->copies[i];
        }
        t->data = p;
    }
    return f;
fail:
    if (root) json_decref(root);
    free(aux);
    em_safetensors_close(f);
    return NULL;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

em_st_file *em_safetensors_open_memory(const void *data, size_t n, const char *name)
{
    if (!name) name = "<memory>";
    if (!data && n) return em__fail(EM_ERR_INVALID, "em_safetensors_open_memory: data is NULL");
    const uint8_t *d = data;
    if (n < 8) return em__fail(EM_ERR_FORMAT, "%s: %zu bytes, shorter than the 8-byte header length", name, n);
    uint64_t hl = le64(d);
    if (hl > EM_ST_MAX_HEADER)
        return em__fail(EM_ERR_FORMAT, "%s: header length %llu above the limit of %llu bytes", name,
                        (unsigned long long)hl, (unsigned long long)EM_ST_MAX_HEADER);
    if (hl > n - 8)
        return em__fail(EM_ERR_FORMAT, "%s: header length %llu beyond the end of the file (%zu bytes)", name,
                        (unsigned long long)hl, n);
    size_t buflen = n - 8 - (size_t)hl;
    uint8_t *buf = aligned_buf(buflen);
    if (!buf) return em__fail(EM_ERR_NOMEM, "%s: out of memory for %zu bytes", name, buflen);
    if (buflen) memcpy(buf, d + 8 + hl, buflen);
    return st_build(name, (const char *)d + 8, (size_t)hl, buf, buflen);
}

static int read_all(FILE *fp, void *dst, size_t n) { return n == 0 || fread(dst, 1, n, fp) == n ? 0 : -1; }

em_st_file *em_safetensors_open(const char *path)
{
    if (!path) return em__fail(EM_ERR_INVALID, "em_safetensors_open: path is NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) return em__fail(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return em__fail(EM_ERR_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    uint8_t lenb[8];
    if (size < 8 || read_all(fp, lenb, 8)) {
        fclose(fp);
        return em__fail(EM_ERR_FORMAT, "%s: %llu bytes, shorter than the 8-byte header length", path,
                        (unsigned long long)size);
    }
    uint64_t hl = le64(lenb);
    if (hl > EM_ST_MAX_HEADER) { /* the crate's order: HeaderTooLarge before InvalidHeaderLength */
        fclose(fp);
        return em__fail(EM_ERR_FORMAT, "%s: header length %llu above the limit of %llu bytes", path,
                        (unsigned long long)hl, (unsigned long long)EM_ST_MAX_HEADER);
    }
    if (hl > size - 8) {
        fclose(fp);
        return em__fail(EM_ERR_FORMAT, "%s: header length %llu beyond the end of the file (%llu bytes)", path,
                        (unsigned long long)hl, (unsigned long long)size);
    }
    size_t buflen = (size_t)(size - 8 - hl);
    char *hdr = malloc((size_t)hl + 1);
    uint8_t *buf = aligned_buf(buflen);
    if (!hdr || !buf) {
        free(hdr);
        free(buf);
        fclose(fp);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory for %llu bytes", path, (unsigned long long)size);
    }
    if (read_all(fp, hdr, (size_t)hl) || read_all(fp, buf, buflen)) {
        int e = ferror(fp) ? errno : 0;
        free(hdr);
        free(buf);
        fclose(fp);
        return em__fail(EM_ERR_IO, "%s: read error: %s", path, e ? strerror(e) : "file shrank while reading");
    }
    fclose(fp);
    em_st_file *f = st_build(path, hdr, (size_t)hl, buf, buflen);
    free(hdr);
    return f;
}

size_t em_safetensors_count(const em_st_file *f) { return f ? f->n : 0; }

const em_st_tensor *em_safetensors_at(const em_st_file *f, size_t i)
{
    if (!f) return em__fail(EM_ERR_INVALID, "em_safetensors_at: file is NULL");
    if (i >= f->n) return em__fail(EM_ERR_INVALID, "%s: tensor index %zu out of range (%zu tensors)", f->path, i, f->n);
    return &f->tensors[i];
}

static const em_st_tensor *st_find(const em_st_file *f, const char *name)
{
    em_st_tensor key;
    key.name = name;
    return bsearch(&key, f->tensors, f->n, sizeof *f->tensors, cmp_tensor_name);
}

const em_st_tensor *em_safetensors_find(const em_st_file *f, const char *name)
{
    if (!f || !name) return em__fail(EM_ERR_INVALID, "em_safetensors_find: file or name is NULL");
    const em_st_tensor *t = st_find(f, name);
    if (!t) return em__fail(EM_ERR_INVALID, "%s: no tensor '%s' in the file", f->path, name);
    return t;
}

em_tensor *em_safetensors_tensor(const em_st_file *f, const char *name)
{
    const em_st_tensor *t = em_safetensors_find(f, name);
    if (!t) return NULL;
    if (t->dtype == EM_DTYPE_COUNT)
        return em__fail(EM_ERR_DTYPE, "%s: unsupported dtype %s for tensor '%s' (Ember has no such dtype)", f->path,
                        t->st_dtype, name);
    return em_from_host(t->data, t->shape, t->ndim, t->dtype);
}

const char *em_safetensors_metadata(const em_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

size_t em_safetensors_metadata_count(const em_st_file *f) { return f ? f->nmeta : 0; }

const em_st_kv *em_safetensors_metadata_at(const em_st_file *f, size_t i)
{
    if (!f || i >= f->nmeta) return NULL;
    return &f->meta[i];
}

/* ---- save ---------------------------------------------------------------------- */

typedef struct save_item {
    const char *name;
    em_tensor *t;
    size_t elem_size;
    size_t nbytes;
    int rank; /* dtype's position in the crate's order */
} save_item;

static int cmp_name_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Layout order of the reference writer: dtype in the crate's enum order,
 * descending (which also puts larger elements first, keeping every tensor
 * aligned to its element size), then by name: the same bytes as
 * safetensors.torch.save_file for the same tensors and no metadata. */
static int cmp_layout(const void *a, const void *b)
{
    const save_item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static mode_t new_file_mode(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0) return sb.st_mode & 07777;
    mode_t mask = 022;
    FILE *s = fopen("/proc/self/status", "r");
    if (s) {
        char line[256];
        while (fgets(line, sizeof line, s))
            if (strncmp(line, "Umask:", 6) == 0) {
                mask = (mode_t)strtol(line + 6, NULL, 8);
                break;
            }
        fclose(s);
    }
    return 0666 & ~mask;
}

static void fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}

em_status em_safetensors_save(const char *path, const char *const names[], em_tensor *const tensors[], size_t n,
                              const em_st_kv *metadata, size_t n_meta)
{
    if (!path || !path[0]) return em__set_error(EM_ERR_INVALID, "em_safetensors_save: path is NULL or empty");
    if (n && (!names || !tensors))
        return em__set_error(EM_ERR_INVALID, "%s: names or tensors is NULL", path);
    if (n_meta && !metadata) return em__set_error(EM_ERR_INVALID, "%s: metadata is NULL", path);
    for (size_t i = 0; i < n_meta; i++)
        if (!metadata[i].key || !metadata[i].value)
            return em__set_error(EM_ERR_INVALID, "%s: metadata entry %zu has a NULL key or value", path, i);

    em_status st = EM_OK;
    save_item *items = calloc(n ? n : 1, sizeof *items);
    const char **sorted = calloc(n ? n : 1, sizeof *sorted);
    json_t *root = NULL;
    char *hdr = NULL, *tmp = NULL;
    int fd = -1;
    if (!items || !sorted) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    /* validate everything before touching the disk */
    for (size_t i = 0; i < n; i++) {
        const char *nm = names[i];
        em_tensor *t = tensors[i];
        if (!nm || !nm[0]) {
            st = em__set_error(EM_ERR_INVALID, "%s: tensor %zu has a NULL or empty name", path, i);
            goto out;
        }
        if (strcmp(nm, "__metadata__") == 0) {
            st = em__set_error(EM_ERR_INVALID, "%s: '__metadata__' is reserved, not a tensor name", path);
            goto out;
        }
        if (!t) {
            st = em__set_error(EM_ERR_INVALID, "%s: tensor '%s' is NULL", path, nm);
            goto out;
        }
        em_dtype dt = em_tensor_dtype(t);
        if (!em_safetensors_dtype_str(dt)) {
            st = em__set_error(EM_ERR_DTYPE, "%s: tensor '%s': dtype %d cannot be stored", path, nm, (int)dt);
            goto out;
        }
        int64_t numel = em_tensor_numel(t);
        if (numel < 0) {
            st = em__set_error(EM_ERR_INVALID, "%s: tensor '%s': bad element count", path, nm);
            goto out;
        }
        items[i].name = nm;
        items[i].t = t;
        items[i].elem_size = em_dtype_size(dt);
        items[i].rank = st_dtype_rank(dt);
        items[i].nbytes = (size_t)numel * items[i].elem_size;
        sorted[i] = nm;
    }
    qsort(sorted, n, sizeof *sorted, cmp_name_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            st = em__set_error(EM_ERR_INVALID, "%s: duplicate tensor name '%s'", path, sorted[i]);
            goto out;
        }
    qsort(items, n, sizeof *items, cmp_layout);

    /* header */
    root = json_object();
    if (!root) goto nomem;
    if (n_meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) goto nomem;
        for (size_t i = 0; i < n_meta; i++) {
            json_t *v = json_string(metadata[i].value);
            if (!v || json_object_set_new(m, metadata[i].key, v)) {
                st = em__set_error(EM_ERR_INVALID, "%s: metadata entry '%s' is not valid UTF-8", path, metadata[i].key);
                goto out;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        save_item *it = &items[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        if (!e || !shape || !offs) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto nomem;
        }
        int nd = em_tensor_ndim(it->t);
        const int64_t *sh = em_tensor_shape(it->t);
        for (int d = 0; d < nd; d++) json_array_append_new(shape, json_integer((json_int_t)sh[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + it->nbytes)));
        off += it->nbytes;
        json_object_set_new(e, "dtype", json_string(em_safetensors_dtype_str(em_tensor_dtype(it->t))));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, it->name, e)) {
            st = em__set_error(EM_ERR_INVALID, "%s: tensor name '%s' is not valid UTF-8", path, it->name);
            goto out;
        }
    }
    hdr = json_dumps(root, JSON_COMPACT);
    if (!hdr) goto nomem;
    size_t hlen = strlen(hdr), pad = (8 - hlen % 8) % 8;
    uint8_t lenb[8];
    uint64_t total = hlen + pad;
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(total >> (8 * i));

    /* write to a temporary file next to path, then rename */
    if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0) {
        tmp = NULL;
        goto nomem;
    }
    mode_t mode = new_file_mode(path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot create temporary file %s: %s", path, tmp, strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    static const char spaces[8] = "        ";
    if (write_all(fd, lenb, 8) || write_all(fd, hdr, hlen) || write_all(fd, spaces, pad)) {
        st = em__set_error(EM_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        save_item *it = &items[i];
        if (!it->nbytes) continue;
        void *b = malloc(it->nbytes);
        if (!b) {
            st = em__set_error(EM_ERR_NOMEM, "%s: out of memory for tensor '%s' (%zu bytes)", path, it->name,
                               it->nbytes);
            goto out;
        }
        em_status s2 = em_to_host(it->t, b, it->nbytes);
        if (s2 != EM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", em_last_error());
            free(b);
            st = em__set_error(s2, "%s: tensor '%s': %s", path, it->name, why);
            goto out;
        }
        int w = write_all(fd, b, it->nbytes);
        int e = errno;
        free(b);
        if (w) {
            st = em__set_error(EM_ERR_IO, "%s: write error: %s", tmp, strerror(e));
            goto out;
        }
    }
    if (fchmod(fd, mode) != 0 || fsync(fd) != 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot sync %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    int c = close(fd);
    fd = -1;
    if (c != 0) {
        st = em__set_error(EM_ERR_IO, "%s: write error on close: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        st = em__set_error(EM_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        goto out;
    }
    free(tmp);
    tmp = NULL; /* renamed: nothing to clean up */
    fsync_dir_of(path);
    goto out;
nomem:
    st = em__set_error(EM_ERR_NOMEM, "%s: out of memory building the header", path);
out:
    if (fd >= 0) close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(hdr);
    if (root) json_decref(root);
    free(items);
    free(sorted);
    return st;
}

/* ---- load into model tensors -------------------------------------------------------- */

/* Appends "'name'" to a list message of capacity cap; ends it with ", ..."
 * once it is full. */
static void list_add(char *buf, size_t cap, int *count, const char *name)
{
    size_t len = strlen(buf), nl = strlen(name);
    (*count)++;
    if (len >= 3 && strcmp(buf + len - 3, "...") == 0) return;
    if (len + nl + 4 + 6 < cap) {
        snprintf(buf + len, cap - len, "%s'%s'", len ? ", " : "", name);
    } else if (len + 6 < cap) {
        snprintf(buf + len, cap - len, "%s", len ? ", ..." : "...");
    }
}

em_status em_safetensors_load_from(const em_st_file *f, const char *const names[], em_tensor *const targets[],
                                   size_t n, bool strict)
{
    if (!f) return em__set_error(EM_ERR_INVALID, "em_safetensors_load_from: file is NULL");
    if (n && (!names || !targets)) return em__set_error(EM_ERR_INVALID, "%s: names or targets is NULL", f->path);
    const char *file = f->path;
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) return em__set_error(EM_ERR_INVALID, "%s: name %zu is NULL", file, i);
        if (!targets[i]) return em__set_error(EM_ERR_INVALID, "%s: key '%s': target tensor is NULL", file, names[i]);
    }
    const char **sorted = calloc(n ? n : 1, sizeof *sorted);
    if (!sorted) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++) sorted[i] = names[i];
    qsort(sorted, n, sizeof *sorted, cmp_name_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            em_status st = em__set_error(EM_ERR_INVALID, "%s: key '%s' requested twice", file, sorted[i]);
            free(sorted);
            return st;
        }

    char missing[768] = "", unexpected[768] = "";
    int nmiss = 0, nunexp = 0;
    for (size_t i = 0; i < n; i++)
        if (!st_find(f, names[i])) list_add(missing, sizeof missing, &nmiss, names[i]);
    if (strict)
        for (size_t i = 0; i < f->n; i++)
            if (!bsearch(&f->tensors[i].name, sorted, n, sizeof *sorted, cmp_name_ptr))
                list_add(unexpected, sizeof unexpected, &nunexp, f->tensors[i].name);
    free(sorted);
    if (nmiss || nunexp) {
        char a[900] = "", b[900] = "";
        if (nmiss) snprintf(a, sizeof a, "%d key%s missing from the file: %s", nmiss, nmiss > 1 ? "s" : "", missing);
        if (nunexp)
            snprintf(b, sizeof b, "%d unexpected key%s in the file (not in the model): %s", nunexp,
                     nunexp > 1 ? "s" : "", unexpected);
        return em__set_error(EM_ERR_FORMAT, "%s: %s%s%s", file, a, nmiss && nunexp ? "; " : "", b);
    }
    for (size_t i = 0; i < n; i++) {
        const em_st_tensor *t = st_find(f, names[i]);
        const em_tensor *dst = targets[i];
        int nd = em_tensor_ndim(dst);
        const int64_t *sh = em_tensor_shape(dst);
        bool same = nd == t->ndim;
        for (int d = 0; same && d < nd; d++) same = sh[d] == t->shape[d];
        if (!same) {
            char s1[160], s2[160];
            em_shape_str(t->shape, t->ndim, s1, sizeof s1);
            em_shape_str(sh, nd, s2, sizeof s2);
            return em__set_error(EM_ERR_SHAPE, "%s: key '%s': shape %s in file, %s in model", file, names[i], s1, s2);
        }
        em_dtype dt = em_tensor_dtype(dst);
        if (t->dtype != dt) {
            const char *md = em_safetensors_dtype_str(dt);
            if (t->dtype == EM_DTYPE_COUNT)
                return em__set_error(EM_ERR_DTYPE, "%s: unsupported dtype %s for tensor '%s' (the model's is %s)", file,
                                     t->st_dtype, names[i], md ? md : "?");
            return em__set_error(EM_ERR_DTYPE, "%s: key '%s': dtype %s in file, %s in model", file, names[i],
                                 t->st_dtype, md ? md : "?");
        }
    }
    /* all checked: build every source first, then copy */
    em_status st = EM_OK;
    em_scope_begin();
    em_tensor **src = calloc(n ? n : 1, sizeof *src);
    if (!src) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    } else {
        for (size_t i = 0; i < n && st == EM_OK; i++) {
            const em_st_tensor *t = st_find(f, names[i]);
            src[i] = em_from_host(t->data, t->shape, t->ndim, t->dtype);
            if (!src[i]) st = em_last_status() < 0 ? em_last_status() : EM_ERR_RUNTIME;
        }
        for (size_t i = 0; i < n && st == EM_OK; i++) {
            st = em_copy_(targets[i], src[i]);
            if (st != EM_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", em_last_error());
                st = em__set_error(st, "%s: key '%s': %s", file, names[i], why);
            }
        }
        free(src);
    }
    em_scope_end();
    return st;
}

em_status em_safetensors_load_into(const char *path, const char *const names[], em_tensor *const targets[], size_t n,
                                   bool strict)
{
    em_st_file *f = em_safetensors_open(path);
    if (!f) return em_last_status() < 0 ? em_last_status() : EM_ERR_IO;
    em_status st = em_safetensors_load_from(f, names, targets, n, strict);
    em_safetensors_close(f);
    return st;
}
