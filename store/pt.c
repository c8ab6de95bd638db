/* PyTorch checkpoints (torch.save zip archives): a zip reader, a safe
 * subset of the pickle machine, the tensors gathered through their strides,
 * key remapping and loading into a module. Format and rules: ember/store.h. */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/store.h"

#include <errno.h>
#include <regex.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "store/pt.c assumes a little-endian host"
#endif

/* ---- little helpers ---------------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static void *aligned_alloc64(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0) return NULL;
    return p;
}

/* ---- zip ------------------------------------------------------------------------------ */

typedef struct zip_entry {
    char *name;
    uint16_t method;
    uint16_t flags;
    uint32_t crc;
    uint64_t csize, usize, local;
    /* the bytes, once read (zip_read_cached) */
    bool loaded;
    const uint8_t *data;
    size_t len;
    uint8_t *owned;
} zip_entry;

typedef struct zip_archive {
    const uint8_t *d;
    size_t n;
    zip_entry *e;
    size_t ne;
} zip_archive;

static void zip_free(zip_archive *z)
{
    for (size_t i = 0; i < z->ne; i++) {
        free(z->e[i].name);
        free(z->e[i].owned);
    }
    free(z->e);
    z->e = NULL;
    z->ne = 0;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const zip_entry *)a)->name, ((const zip_entry *)b)->name);
}

/* Reads the central directory (ZIP64 too). */
static em_status zip_open(const char *file, const uint8_t *d, size_t n, zip_archive *z)
{
    memset(z, 0, sizeof *z);
    z->d = d;
    z->n = n;
    if (n < 22) return em__set_error(EM_ERR_FORMAT, "%s: %zu bytes: too short for a zip archive", file, n);
    size_t lo = n - 22 > 65535 ? n - 22 - 65535 : 0, eocd = SIZE_MAX;
    for (size_t p = n - 22 + 1; p-- > lo;)
        if (rd32(d + p) == 0x06054b50 && p + 22 + rd16(d + p + 20) <= n) {
            eocd = p;
            break;
        }
    if (eocd == SIZE_MAX)
        return em__set_error(EM_ERR_FORMAT, "%s: no zip end-of-central-directory record (truncated or not a zip archive)",
                             file);
    uint64_t count = rd16(d + eocd + 10), cdsize = rd32(d + eocd + 12), cdoff = rd32(d + eocd + 16);
    if (rd16(d + eocd + 4) != 0 || rd16(d + eocd + 6) != 0)
        return em__set_error(EM_ERR_UNSUPPORTED, "%s: multi-disk zip archives are not supported", file);
    if (count == 0xFFFF || cdsize == 0xFFFFFFFFu || cdoff == 0xFFFFFFFFu) {
        if (eocd < 20 || rd32(d + eocd - 20) != 0x07064b50)
            return em__set_error(EM_ERR_FORMAT, "%s: ZIP64 values without a ZIP64 end-of-central-directory locator", file);
        uint64_t z64 = rd64(d + eocd - 20 + 8);
        if (z64 > n || n - z64 < 56 || rd32(d + z64) != 0x06064b50)
            return em__set_error(EM_ERR_FORMAT, "%s: bad ZIP64 end-of-central-directory record at %llu", file,
                                 (unsigned long long)z64);
        count = rd64(d + z64 + 32);
        cdsize = rd64(d + z64 + 40);
        cdoff = rd64(d + z64 + 48);
    }
    if (cdoff > n || cdsize > n - cdoff)
        return em__set_error(EM_ERR_FORMAT, "%s: zip central directory [%llu, +%llu) beyond the %zu-byte file (truncated?)",
                             file, (unsigned long long)cdoff, (unsigned long long)cdsize, n);
    if (count > cdsize / 46)
        return em__set_error(EM_ERR_FORMAT, "%s: zip central directory of %llu bytes cannot hold %llu entries", file,
                             (unsigned long long)cdsize, (unsigned long long)count);
    z->e = calloc(count ? count : 1, sizeof *z->e);
    if (!z->e) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    const uint8_t *p = d + cdoff, *end = d + cdoff + cdsize;
    for (uint64_t i = 0; i < count; i++) {
        if (end - p < 46 || rd32(p) != 0x02014b50) {
            zip_free(z);
            return em__set_error(EM_ERR_FORMAT, "%s: zip central directory entry %llu is damaged", file,
                                 (unsigned long long)i);
        }
        size_t nl = rd16(p + 28), xl = rd16(p + 30), cl = rd16(p + 32);
        if ((size_t)(end - p) - 46 < nl + xl + cl) {
            zip_free(z);
            return em__set_error(EM_ERR_FORMAT, "%s: zip central directory entry %llu runs past the directory", file,
                                 (unsigned long long)i);
        }
        zip_entry *e = &z->e[z->ne];
        e->flags = rd16(p + 8);
        e->method = rd16(p + 10);
        e->crc = rd32(p + 16);
        e->csize = rd32(p + 20);
        e->usize = rd32(p + 24);
        e->local = rd32(p + 42);
        e->name = strndup((const char *)p + 46, nl);
        if (!e->name) {
            zip_free(z);
            return em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
        }
        z->ne++;
        /* ZIP64 extra field: the 8-byte values, in this order, of those at 0xFFFFFFFF */
        const uint8_t *x = p + 46 + nl, *xe = x + xl;
        while (xe - x >= 4) {
            uint16_t id = rd16(x), sz = rd16(x + 2);
            if ((size_t)(xe - x) - 4 < sz) break;
            if (id == 0x0001) {
                const uint8_t *v = x + 4, *ve = v + sz;
                if (e->usize == 0xFFFFFFFFu && ve - v >= 8) e->usize = rd64(v), v += 8;
                if (e->csize == 0xFFFFFFFFu && ve - v >= 8) e->csize = rd64(v), v += 8;
                if (e->local == 0xFFFFFFFFu && ve - v >= 8) e->local = rd64(v), v += 8;
            }
            x += 4 + sz;
        }
        p += 46 + nl + xl + cl;
    }
    /* sorted by name for the lookups; a name twice is ambiguous */
    qsort(z->e, z->ne, sizeof *z->e, cmp_entry_name);
    for (size_t i = 1; i < z->ne; i++)
        if (!strcmp(z->e[i - 1].name, z->e[i].name)) {
            em_status st = em__set_error(EM_ERR_FORMAT, "%s: the zip archive holds two records named '%s'", file, z->e[i].name);
            zip_free(z);
            return st;
        }
    return EM_OK;
}

static zip_entry *zip_find(const zip_archive *z, const char *name)
{
    zip_entry key;
    key.name = (char *)name;
    return bsearch(&key, z->e, z->ne, sizeof *z->e, cmp_entry_name);
}

/* The bytes of an entry: *out points into the archive (STORED) or to a new
 * buffer in *owned (DEFLATE). CRC checked. */
static em_status zip_read(const char *file, const zip_archive *z, const zip_entry *e, const uint8_t **out, size_t *len,
                          uint8_t **owned)
{
    *owned = NULL;
    if (e->flags & 1) return em__set_error(EM_ERR_UNSUPPORTED, "%s: record '%s' is encrypted", file, e->name);
    if (e->local > z->n || z->n - e->local < 30 || rd32(z->d + e->local) != 0x04034b50)
        return em__set_error(EM_ERR_FORMAT, "%s: record '%s': bad local header offset %llu (file truncated?)", file, e->name,
                             (unsigned long long)e->local);
    uint64_t start = e->local + 30 + (uint64_t)rd16(z->d + e->local + 26) + rd16(z->d + e->local + 28);
    if (start > z->n || e->csize > z->n - start)
        return em__set_error(EM_ERR_FORMAT, "%s: record '%s': %llu bytes at %llu run past the %zu-byte file (truncated?)",
                             file, e->name, (unsigned long long)e->csize, (unsigned long long)start, z->n);
    if (e->usize > SIZE_MAX / 2)
        return em__set_error(EM_ERR_FORMAT, "%s: record '%s': size %llu too large", file, e->name,
                             (unsigned long long)e->usize);
    const uint8_t *src = z->d + start;
    if (e->method == 0) {
        if (e->csize != e->usize)
            return em__set_error(EM_ERR_FORMAT, "%s: record '%s': stored with %llu bytes but a size of %llu", file, e->name,
                                 (unsigned long long)e->csize, (unsigned long long)e->usize);
        *out = src;
        *len = (size_t)e->usize;
    } else if (e->method == 8) {
        /* DEFLATE expands at most ~1032:1: refuse sizes no stream can produce before allocating */
        if (e->usize / 1032 > e->csize + 1)
            return em__set_error(EM_ERR_FORMAT, "%s: record '%s': %llu compressed bytes cannot inflate to %llu", file,
                                 e->name, (unsigned long long)e->csize, (unsigned long long)e->usize);
        uint8_t *buf = aligned_alloc64((size_t)e->usize);
        if (!buf) return em__set_error(EM_ERR_NOMEM, "%s: record '%s': out of memory", file, e->name);
        z_stream s;
        memset(&s, 0, sizeof s);
        if (inflateInit2(&s, -15) != Z_OK) {
            free(buf);
            return em__set_error(EM_ERR_RUNTIME, "%s: zlib inflateInit2 failed", file);
        }
        uint64_t in_left = e->csize, out_left = e->usize;
        s.next_in = (Bytef *)src;
        s.next_out = buf;
        int rc = Z_OK;
        while (rc == Z_OK) {
            if (s.avail_in == 0) {
                s.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
                in_left -= s.avail_in;
            }
            if (s.avail_out == 0) {
                s.avail_out = (uInt)(out_left > (1u << 30) ? (1u << 30) : out_left);
                out_left -= s.avail_out;
            }
            uInt ai = s.avail_in, ao = s.avail_out;
            rc = inflate(&s, Z_NO_FLUSH);
            if (rc == Z_BUF_ERROR || (rc == Z_OK && ai == s.avail_in && ao == s.avail_out)) break;
        }
        uint64_t got = s.total_out;
        inflateEnd(&s);
        if (rc != Z_STREAM_END || got != e->usize) {
            free(buf);
            return em__set_error(EM_ERR_FORMAT, "%s: record '%s': damaged DEFLATE data (%s)", file, e->name,
                                 rc == Z_STREAM_END ? "wrong size" : "stream error or truncated");
        }
        *owned = buf;
        *out = buf;
        *len = (size_t)e->usize;
    } else {
        return em__set_error(EM_ERR_UNSUPPORTED, "%s: record '%s': zip compression method %u (only STORED and DEFLATE)",
                             file, e->name, e->method);
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < *len;) {
        size_t k = *len - off > (1u << 30) ? (1u << 30) : *len - off;
        crc = crc32(crc, *out + off, (uInt)k);
        off += k;
    }
    if ((uint32_t)crc != e->crc) {
        free(*owned);
        *owned = NULL;
        return em__set_error(EM_ERR_FORMAT, "%s: record '%s': CRC-32 mismatch (file damaged)", file, e->name);
    }
    return EM_OK;
}

/* ---- pickle values ------------------------------------------------------------------- */

typedef enum pk_kind {
    PK_NONE,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,
    PK_TUPLE,
    PK_LIST,
    PK_DICT,
    PK_GLOBAL,
    PK_STORAGE,
    PK_TENSOR,
} pk_kind;

static const char *const pk_kind_name[] = {"None", "bool", "int", "float", "str", "tuple",
                                           "list", "dict", "global", "storage", "tensor"};

/* The callables and classes allowed: everything else is refused at GLOBAL. */
typedef enum pk_global {
    G_ORDERED_DICT,
    G_REBUILD_TENSOR_V2,
    G_REBUILD_PARAMETER,
    G_STORAGE, /* with a dtype */
} pk_global;

typedef struct pk_storage_class {
    const char *name;
    em_dtype dt;
} pk_storage_class;

static const pk_storage_class storage_classes[] = {
    {"FloatStorage", EM_F32}, {"DoubleStorage", EM_F64}, {"HalfStorage", EM_F16}, {"BFloat16Storage", EM_BF16},
    {"LongStorage", EM_I64},  {"IntStorage", EM_I32},    {"ByteStorage", EM_U8},  {"BoolStorage", EM_BOOL},
};
#define N_STORAGE_CLASSES (sizeof storage_classes / sizeof storage_classes[0])

typedef struct pv pv;
struct pv {
    pk_kind kind;
    pv *next_alloc; /* every value, for freeing */
    int64_t i;      /* INT, BOOL; GLOBAL: pk_global */
    double f;
    char *s;        /* STR (NUL-terminated, no NUL inside), STORAGE: key */
    pv **items;     /* TUPLE / LIST items; DICT: key, value, key, value, ... */
    size_t n, cap;  /* items (DICT: pairs) */
    /* GLOBAL G_STORAGE / STORAGE / TENSOR */
    em_dtype dt;
    const char *sclass;
    int64_t numel; /* STORAGE: elements */
    pv *storage;   /* TENSOR */
    int64_t offset;
    int ndim;
    int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
};

typedef struct pk_vm {
    const char *file;
    const uint8_t *p;
    size_t n, pos, op_at;
    pv *all;
    size_t nalloc;
    pv **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks;
    pv **memo;
    size_t memo_cap, memo_count;
} pk_vm;

#define PK_MAX_STACK ((size_t)1 << 22)

static em_status pk_err(pk_vm *vm, em_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static em_status pk_err(pk_vm *vm, em_status st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return em__set_error(st, "%s: data.pkl byte %zu: %s", vm->file, vm->op_at, msg);
}

static pv *pk_new(pk_vm *vm, pk_kind k)
{
    pv *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->kind = k;
    v->next_alloc = vm->all;
    vm->all = v;
    vm->nalloc++;
    return v;
}

static void pk_free_all(pk_vm *vm)
{
    pv *v = vm->all;
    while (v) {
        pv *nx = v->next_alloc;
        free(v->s);
        free(v->items);
        free(v);
        v = nx;
    }
    vm->all = NULL;
    free(vm->stack);
    free(vm->marks);
    free(vm->memo);
}

/* Entries above the innermost MARK: what an opcode may pop (Python's current stack). */
static size_t pk_avail(const pk_vm *vm) { return vm->sp - (vm->nmarks ? vm->marks[vm->nmarks - 1] : 0); }

static em_status pk_push(pk_vm *vm, pv *v)
{
    if (!v) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
    if (vm->sp == vm->scap) {
        if (vm->scap >= PK_MAX_STACK) return pk_err(vm, EM_ERR_FORMAT, "stack deeper than %zu entries", PK_MAX_STACK);
        size_t cap = vm->scap ? vm->scap * 2 : 64;
        pv **ns = realloc(vm->stack, cap * sizeof *ns);
        if (!ns) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
        vm->stack = ns;
        vm->scap = cap;
    }
    vm->stack[vm->sp++] = v;
    return EM_OK;
}

static em_status pk_append(pk_vm *vm, pv *c, pv *item)
{
    size_t per = c->kind == PK_DICT ? 2 : 1;
    if (c->n * per + per > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        pv **ni = realloc(c->items, cap * sizeof *ni);
        if (!ni) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
        c->items = ni;
        c->cap = cap;
    }
    c->items[c->n * per] = item;
    c->n++;
    return EM_OK;
}

static em_status pk_setitem(pk_vm *vm, pv *d, pv *k, pv *v)
{
    if (d->kind != PK_DICT)
        return pk_err(vm, EM_ERR_FORMAT, "SETITEM on a %s, not a dict", pk_kind_name[d->kind]);
    /* no search for an existing key (quadratic): a key set twice with a tensor
     * shows up as two tensors with one flattened key, an error */
    size_t at = d->n;
    em_status st = pk_append(vm, d, k);
    if (st == EM_OK) d->items[2 * at + 1] = v;
    return st;
}

/* Pops the items above the last MARK into a new tuple / list. */
static em_status pk_pop_mark(pk_vm *vm, size_t *base)
{
    if (!vm->nmarks) return pk_err(vm, EM_ERR_FORMAT, "no MARK on the stack");
    *base = vm->marks[--vm->nmarks];
    return EM_OK;
}

static pv *pk_tuple_from(pk_vm *vm, pv **items, size_t n)
{
    pv *t = pk_new(vm, PK_TUPLE);
    if (!t) return NULL;
    if (n) {
        t->items = malloc(n * sizeof *t->items);
        if (!t->items) return NULL;
        memcpy(t->items, items, n * sizeof *t->items);
    }
    t->n = t->cap = n;
    return t;
}

static em_status pk_need(pk_vm *vm, size_t k)
{
    if (vm->n - vm->pos < k) return pk_err(vm, EM_ERR_FORMAT, "truncated (opcode argument past the end of data.pkl)");
    return EM_OK;
}

static em_status pk_memo_put(pk_vm *vm, uint64_t idx)
{
    if (!pk_avail(vm)) return pk_err(vm, EM_ERR_FORMAT, "memo store with an empty stack");
    /* Python numbers the memo 0, 1, 2, ...: an index past the pickle's length is not a pickle's */
    if (idx >= vm->n) return pk_err(vm, EM_ERR_FORMAT, "memo index %llu out of range", (unsigned long long)idx);
    if (idx >= vm->memo_cap) {
        size_t cap = vm->memo_cap ? vm->memo_cap : 64;
        while (cap <= idx) cap *= 2;
        if (cap > vm->n) cap = vm->n;
        pv **nm = realloc(vm->memo, cap * sizeof *nm);
        if (!nm) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
        memset(nm + vm->memo_cap, 0, (cap - vm->memo_cap) * sizeof *nm);
        vm->memo = nm;
        vm->memo_cap = cap;
    }
    if (!vm->memo[idx]) vm->memo_count++;
    vm->memo[idx] = vm->stack[vm->sp - 1];
    return EM_OK;
}

static em_status pk_memo_get(pk_vm *vm, uint64_t idx)
{
    if (idx >= vm->memo_cap || !vm->memo[idx])
        return pk_err(vm, EM_ERR_FORMAT, "memo entry %llu read before it was stored", (unsigned long long)idx);
    return pk_push(vm, vm->memo[idx]);
}

static em_status pk_string(pk_vm *vm, uint64_t len)
{
    if (len > vm->n - vm->pos) return pk_err(vm, EM_ERR_FORMAT, "truncated (a %llu-byte string past the end of data.pkl)",
                                             (unsigned long long)len);
    if (memchr(vm->p + vm->pos, 0, (size_t)len)) return pk_err(vm, EM_ERR_FORMAT, "string with a NUL character");
    pv *v = pk_new(vm, PK_STR);
    if (!v || !(v->s = strndup((const char *)vm->p + vm->pos, (size_t)len))) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
    v->n = (size_t)len;
    vm->pos += (size_t)len;
    return pk_push(vm, v);
}

static const char allowed_globals[] =
    "collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and torch.*Storage of "
    "float/double/half/bfloat16/long/int/byte/bool";

static em_status pk_global_push(pk_vm *vm, const char *mod, const char *name, const char *op)
{
    pv *g = pk_new(vm, PK_GLOBAL);
    if (!g) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
    if (!strcmp(mod, "collections") && !strcmp(name, "OrderedDict")) g->i = G_ORDERED_DICT;
    else if (!strcmp(mod, "torch._utils") && !strcmp(name, "_rebuild_tensor_v2")) g->i = G_REBUILD_TENSOR_V2;
    else if (!strcmp(mod, "torch._utils") && !strcmp(name, "_rebuild_parameter")) g->i = G_REBUILD_PARAMETER;
    else {
        bool found = false;
        if (!strcmp(mod, "torch"))
            for (size_t i = 0; i < N_STORAGE_CLASSES; i++)
                if (!strcmp(name, storage_classes[i].name)) {
                    g->i = G_STORAGE;
                    g->dt = storage_classes[i].dt;
                    g->sclass = storage_classes[i].name;
                    found = true;
                }
        if (!found) {
            if (!strcmp(mod, "torch") && strstr(name, "Storage"))
                return pk_err(vm, EM_ERR_UNSUPPORTED, "%s 'torch.%.60s': storage dtype not supported (only %s)", op, name,
                              allowed_globals);
            /* torch.save(model) pickles the module's class: say what to save instead */
            bool module = !strncmp(mod, "torch.nn.", 9) || !strcmp(mod, "__main__");
            return pk_err(vm, EM_ERR_FORMAT,
                          "%s '%.60s.%.60s' is not allowed (a state_dict needs only %s; nothing is executed)%s", op, mod,
                          name, allowed_globals,
                          module ? "; this looks like a whole pickled module (torch.save(model)): save "
                                   "model.state_dict() instead"
                                 : "");
        }
    }
    return pk_push(vm, g);
}

/* Reads a "...\n" line of GLOBAL. */
static em_status pk_line(pk_vm *vm, char *out, size_t cap)
{
    const uint8_t *nl = memchr(vm->p + vm->pos, '\n', vm->n - vm->pos);
    if (!nl) return pk_err(vm, EM_ERR_FORMAT, "truncated (GLOBAL without a newline)");
    size_t len = (size_t)(nl - (vm->p + vm->pos));
    if (len >= cap) return pk_err(vm, EM_ERR_FORMAT, "GLOBAL name of %zu bytes is too long", len);
    memcpy(out, vm->p + vm->pos, len);
    out[len] = 0;
    if (strlen(out) != len) return pk_err(vm, EM_ERR_FORMAT, "GLOBAL name with a NUL character");
    vm->pos += len + 1;
    return EM_OK;
}

static bool pk_int_of(const pv *v, int64_t *out)
{
    if (v->kind != PK_INT) return false;
    *out = v->i;
    return true;
}

/* torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
 * requires_grad, backward_hooks[, metadata]): checked, not called. */
static pv *pk_rebuild_tensor(pk_vm *vm, const pv *args, em_status *st)
{
    *st = EM_OK;
    if (args->n != 6 && args->n != 7) {
        *st = pk_err(vm, EM_ERR_FORMAT, "_rebuild_tensor_v2 with %zu arguments (6 or 7 expected)", args->n);
        return NULL;
    }
    pv *s = args->items[0], *sz = args->items[2], *sd = args->items[3];
    int64_t off;
    if (s->kind != PK_STORAGE || !pk_int_of(args->items[1], &off) || (sz->kind != PK_TUPLE) || (sd->kind != PK_TUPLE)) {
        *st = pk_err(vm, EM_ERR_FORMAT, "_rebuild_tensor_v2 arguments are not (storage, int, tuple, tuple, ...)");
        return NULL;
    }
    if (sz->n != sd->n) {
        *st = pk_err(vm, EM_ERR_FORMAT, "_rebuild_tensor_v2: %zu sizes but %zu strides", sz->n, sd->n);
        return NULL;
    }
    if (sz->n > EM_MAX_DIMS) {
        *st = pk_err(vm, EM_ERR_UNSUPPORTED, "tensor of rank %zu above Ember's limit of %d dimensions", sz->n, EM_MAX_DIMS);
        return NULL;
    }
    pv *t = pk_new(vm, PK_TENSOR);
    if (!t) {
        *st = pk_err(vm, EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    t->storage = s;
    t->offset = off;
    t->dt = s->dt;
    t->ndim = (int)sz->n;
    for (size_t d = 0; d < sz->n; d++)
        if (!pk_int_of(sz->items[d], &t->shape[d]) || !pk_int_of(sd->items[d], &t->stride[d])) {
            *st = pk_err(vm, EM_ERR_FORMAT, "_rebuild_tensor_v2: size or stride %zu is not an int", d);
            return NULL;
        }
    return t;
}

static em_status pk_reduce(pk_vm *vm)
{
    if (pk_avail(vm) < 2) return pk_err(vm, EM_ERR_FORMAT, "REDUCE with fewer than 2 stack entries");
    pv *args = vm->stack[--vm->sp], *fn = vm->stack[--vm->sp];
    if (fn->kind != PK_GLOBAL) return pk_err(vm, EM_ERR_FORMAT, "REDUCE of a %s (not callable)", pk_kind_name[fn->kind]);
    if (args->kind != PK_TUPLE) return pk_err(vm, EM_ERR_FORMAT, "REDUCE with %s arguments (not a tuple)", pk_kind_name[args->kind]);
    em_status st = EM_OK;
    switch ((pk_global)fn->i) {
    case G_ORDERED_DICT:
        if (args->n != 0) return pk_err(vm, EM_ERR_FORMAT, "OrderedDict called with %zu arguments (0 expected)", args->n);
        return pk_push(vm, pk_new(vm, PK_DICT));
    case G_REBUILD_TENSOR_V2: {
        pv *t = pk_rebuild_tensor(vm, args, &st);
        return t ? pk_push(vm, t) : st;
    }
    case G_REBUILD_PARAMETER: /* (data, requires_grad, backward_hooks): the tensor itself */
        if ((args->n != 3 && args->n != 4) || args->items[0]->kind != PK_TENSOR)
            return pk_err(vm, EM_ERR_FORMAT, "_rebuild_parameter arguments are not (tensor, bool, hooks)");
        return pk_push(vm, args->items[0]);
    case G_STORAGE:
        return pk_err(vm, EM_ERR_FORMAT, "REDUCE of torch.%s is not allowed (storages come from BINPERSID)", fn->sclass);
    }
    return pk_err(vm, EM_ERR_FORMAT, "REDUCE of an unknown callable");
}

/* ('storage', torch.XStorage, key, location, numel) */
static em_status pk_persid(pk_vm *vm)
{
    if (!pk_avail(vm)) return pk_err(vm, EM_ERR_FORMAT, "BINPERSID with an empty stack");
    pv *pid = vm->stack[--vm->sp];
    if (pid->kind != PK_TUPLE || pid->n != 5 || pid->items[0]->kind != PK_STR || strcmp(pid->items[0]->s, "storage") ||
        pid->items[1]->kind != PK_GLOBAL || pid->items[1]->i != G_STORAGE || pid->items[2]->kind != PK_STR ||
        pid->items[3]->kind != PK_STR || pid->items[4]->kind != PK_INT)
        return pk_err(vm, EM_ERR_FORMAT,
                      "BINPERSID of something other than ('storage', torch.<type>Storage, key, location, numel)");
    if (pid->items[4]->i < 0) return pk_err(vm, EM_ERR_FORMAT, "storage of %lld elements", (long long)pid->items[4]->i);
    pv *s = pk_new(vm, PK_STORAGE);
    if (!s || !(s->s = strdup(pid->items[2]->s))) return pk_err(vm, EM_ERR_NOMEM, "out of memory");
    s->dt = pid->items[1]->dt;
    s->sclass = pid->items[1]->sclass;
    s->numel = pid->items[4]->i;
    return pk_push(vm, s);
}

/* Runs data.pkl; the object STOP returns in *result. */
static em_status pk_run(pk_vm *vm, pv **result)
{
    em_status st = EM_OK;
    char mod[256], name[256];
    while (st == EM_OK) {
        if (vm->pos >= vm->n) {
            vm->op_at = vm->pos;
            return pk_err(vm, EM_ERR_FORMAT, "truncated (no STOP opcode)");
        }
        vm->op_at = vm->pos;
        uint8_t op = vm->p[vm->pos++];
        const uint8_t *a = vm->p + vm->pos;
        switch (op) {
        case 0x80: /* PROTO */
            if ((st = pk_need(vm, 1))) break;
            if (a[0] > 5) st = pk_err(vm, EM_ERR_FORMAT, "pickle protocol %u (0 to 5 are known)", a[0]);
            vm->pos++;
            break;
        case 0x95: /* FRAME: a length hint of protocol 4 */
            if ((st = pk_need(vm, 8))) break;
            vm->pos += 8;
            break;
        case '.': /* STOP */
            if (!pk_avail(vm)) return pk_err(vm, EM_ERR_FORMAT, "STOP with an empty stack");
            *result = vm->stack[vm->sp - 1];
            return EM_OK;
        case '}': st = pk_push(vm, pk_new(vm, PK_DICT)); break;
        case ']': st = pk_push(vm, pk_new(vm, PK_LIST)); break;
        case ')': st = pk_push(vm, pk_new(vm, PK_TUPLE)); break;
        case 'N': st = pk_push(vm, pk_new(vm, PK_NONE)); break;
        case 0x88: /* NEWTRUE */
        case 0x89: { /* NEWFALSE */
            pv *v = pk_new(vm, PK_BOOL);
            if (v) v->i = op == 0x88;
            st = pk_push(vm, v);
            break;
        }
        case '(': /* MARK */
            if (vm->nmarks >= EM_PT_MAX_MARKS) {
                st = pk_err(vm, EM_ERR_FORMAT, "MARK nested deeper than %d levels", EM_PT_MAX_MARKS);
                break;
            }
            if (!vm->marks && !(vm->marks = malloc(EM_PT_MAX_MARKS * sizeof *vm->marks))) {
                st = pk_err(vm, EM_ERR_NOMEM, "out of memory");
                break;
            }
            vm->marks[vm->nmarks++] = vm->sp;
            break;
        case 'X': /* BINUNICODE */
            if ((st = pk_need(vm, 4))) break;
            vm->pos += 4;
            st = pk_string(vm, rd32(a));
            break;
        case 0x8d: /* BINUNICODE8 */
            if ((st = pk_need(vm, 8))) break;
            vm->pos += 8;
            st = pk_string(vm, rd64(a));
            break;
        case 0x8c: /* SHORT_BINUNICODE */
            if ((st = pk_need(vm, 1))) break;
            vm->pos += 1;
            st = pk_string(vm, a[0]);
            break;
        case 'q': /* BINPUT */
            if ((st = pk_need(vm, 1))) break;
            vm->pos += 1;
            st = pk_memo_put(vm, a[0]);
            break;
        case 'r': /* LONG_BINPUT */
            if ((st = pk_need(vm, 4))) break;
            vm->pos += 4;
            st = pk_memo_put(vm, rd32(a));
            break;
        case 0x94: /* MEMOIZE */
            st = pk_memo_put(vm, vm->memo_count);
            break;
        case 'h': /* BINGET */
            if ((st = pk_need(vm, 1))) break;
            vm->pos += 1;
            st = pk_memo_get(vm, a[0]);
            break;
        case 'j': /* LONG_BINGET */
            if ((st = pk_need(vm, 4))) break;
            vm->pos += 4;
            st = pk_memo_get(vm, rd32(a));
            break;
        case 'J':   /* BININT: signed 32 */
        case 'K':   /* BININT1 */
        case 'M':   /* BININT2 */
        case 0x8a: { /* LONG1 */
            int64_t v = 0;
            if (op == 'J') {
                if ((st = pk_need(vm, 4))) break;
                v = (int32_t)rd32(a);
                vm->pos += 4;
            } else if (op == 'K') {
                if ((st = pk_need(vm, 1))) break;
                v = a[0];
                vm->pos += 1;
            } else if (op == 'M') {
                if ((st = pk_need(vm, 2))) break;
                v = rd16(a);
                vm->pos += 2;
            } else {
                if ((st = pk_need(vm, 1))) break;
                unsigned nb = a[0];
                if (nb > 8) {
                    st = pk_err(vm, EM_ERR_FORMAT, "LONG1 of %u bytes (integers above 64 bits are not supported)", nb);
                    break;
                }
                if ((st = pk_need(vm, 1 + nb))) break;
                uint64_t u = 0;
                for (unsigned k = 0; k < nb; k++) u |= (uint64_t)a[1 + k] << (8 * k);
                if (nb && nb < 8 && (a[nb] & 0x80)) u |= ~(uint64_t)0 << (8 * nb); /* sign-extend */
                v = (int64_t)u;
                vm->pos += 1 + nb;
            }
            pv *x = pk_new(vm, PK_INT);
            if (x) x->i = v;
            st = pk_push(vm, x);
            break;
        }
        case 'G': { /* BINFLOAT: big-endian double */
            if ((st = pk_need(vm, 8))) break;
            uint64_t u = 0;
            for (int k = 0; k < 8; k++) u = u << 8 | a[k];
            vm->pos += 8;
            pv *x = pk_new(vm, PK_FLOAT);
            if (x) memcpy(&x->f, &u, 8);
            st = pk_push(vm, x);
            break;
        }
        case 't': /* TUPLE */
        case 'l': /* LIST */
        case 'd': { /* DICT */
            size_t base = 0;
            if ((st = pk_pop_mark(vm, &base))) break;
            size_t k = vm->sp - base;
            pv *c;
            if (op == 't') {
                c = pk_tuple_from(vm, k ? vm->stack + base : NULL, k);
            } else {
                c = pk_new(vm, op == 'l' ? PK_LIST : PK_DICT);
                if (op == 'd' && k % 2) {
                    st = pk_err(vm, EM_ERR_FORMAT, "DICT with an odd number (%zu) of items", k);
                    break;
                }
                for (size_t i = 0; c && i < k && st == EM_OK; i += op == 'l' ? 1 : 2)
                    st = op == 'l' ? pk_append(vm, c, vm->stack[base + i])
                                   : pk_setitem(vm, c, vm->stack[base + i], vm->stack[base + i + 1]);
                if (st) break;
            }
            vm->sp = base;
            st = pk_push(vm, c);
            break;
        }
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: { /* TUPLE3 */
            size_t k = (size_t)(op - 0x84);
            if (pk_avail(vm) < k) {
                st = pk_err(vm, EM_ERR_FORMAT, "TUPLE%zu with %zu stack entries above the MARK", k, pk_avail(vm));
                break;
            }
            pv *c = pk_tuple_from(vm, vm->stack + vm->sp - k, k);
            vm->sp -= k;
            st = pk_push(vm, c);
            break;
        }
        case 's': /* SETITEM */
            if (pk_avail(vm) < 3) {
                st = pk_err(vm, EM_ERR_FORMAT, "SETITEM with %zu stack entries", pk_avail(vm));
                break;
            }
            st = pk_setitem(vm, vm->stack[vm->sp - 3], vm->stack[vm->sp - 2], vm->stack[vm->sp - 1]);
            vm->sp -= 2;
            break;
        case 'u': /* SETITEMS */
        case 'e': { /* APPENDS */
            size_t base = 0;
            if ((st = pk_pop_mark(vm, &base))) break;
            if (base <= (vm->nmarks ? vm->marks[vm->nmarks - 1] : 0)) {
                st = pk_err(vm, EM_ERR_FORMAT, "%s with no container below the MARK", op == 'u' ? "SETITEMS" : "APPENDS");
                break;
            }
            pv *c = vm->stack[base - 1];
            size_t k = vm->sp - base;
            if (op == 'u') {
                if (k % 2) {
                    st = pk_err(vm, EM_ERR_FORMAT, "SETITEMS with an odd number (%zu) of items", k);
                    break;
                }
                for (size_t i = 0; i < k && st == EM_OK; i += 2)
                    st = pk_setitem(vm, c, vm->stack[base + i], vm->stack[base + i + 1]);
            } else {
                if (c->kind != PK_LIST) {
                    st = pk_err(vm, EM_ERR_FORMAT, "APPENDS to a %s, not a list", pk_kind_name[c->kind]);
                    break;
                }
                for (size_t i = 0; i < k && st == EM_OK; i++) st = pk_append(vm, c, vm->stack[base + i]);
            }
            vm->sp = base;
            break;
        }
        case 'a': /* APPEND */
            if (pk_avail(vm) < 2) {
                st = pk_err(vm, EM_ERR_FORMAT, "APPEND with %zu stack entries", pk_avail(vm));
                break;
            }
            if (vm->stack[vm->sp - 2]->kind != PK_LIST) {
                st = pk_err(vm, EM_ERR_FORMAT, "APPEND to a %s, not a list", pk_kind_name[vm->stack[vm->sp - 2]->kind]);
                break;
            }
            st = pk_append(vm, vm->stack[vm->sp - 2], vm->stack[vm->sp - 1]);
            vm->sp--;
            break;
        case '0': /* POP */
            if (pk_avail(vm)) vm->sp--;
            else if (vm->nmarks) vm->nmarks--; /* Python pops the mark */
            else st = pk_err(vm, EM_ERR_FORMAT, "POP with an empty stack");
            break;
        case '1': { /* POP_MARK */
            size_t base = 0;
            if ((st = pk_pop_mark(vm, &base))) break;
            vm->sp = base;
            break;
        }
        case '2': /* DUP */
            if (!pk_avail(vm)) st = pk_err(vm, EM_ERR_FORMAT, "DUP with an empty stack");
            else st = pk_push(vm, vm->stack[vm->sp - 1]);
            break;
        case 'c': /* GLOBAL "module\nname\n" */
            if ((st = pk_line(vm, mod, sizeof mod)) || (st = pk_line(vm, name, sizeof name))) break;
            st = pk_global_push(vm, mod, name, "GLOBAL");
            break;
        case 0x93: { /* STACK_GLOBAL */
            if (pk_avail(vm) < 2 || vm->stack[vm->sp - 1]->kind != PK_STR || vm->stack[vm->sp - 2]->kind != PK_STR) {
                st = pk_err(vm, EM_ERR_FORMAT, "STACK_GLOBAL without two strings on the stack");
                break;
            }
            pv *nm = vm->stack[--vm->sp], *md = vm->stack[--vm->sp];
            st = pk_global_push(vm, md->s, nm->s, "STACK_GLOBAL");
            break;
        }
        case 'R': st = pk_reduce(vm); break;
        case 'Q': st = pk_persid(vm); break;
        case 'b': { /* BUILD: only OrderedDict's _metadata (state ignored) */
            if (pk_avail(vm) < 2) {
                st = pk_err(vm, EM_ERR_FORMAT, "BUILD with %zu stack entries", pk_avail(vm));
                break;
            }
            pv *state = vm->stack[vm->sp - 1], *obj = vm->stack[vm->sp - 2];
            if (obj->kind != PK_DICT || (state->kind != PK_DICT && state->kind != PK_NONE)) {
                st = pk_err(vm, EM_ERR_FORMAT, "BUILD of a %s with a %s state (only a dict's attributes are accepted)",
                            pk_kind_name[obj->kind], pk_kind_name[state->kind]);
                break;
            }
            vm->sp--;
            break;
        }
        default:
            if (op >= 0x20 && op < 0x7f)
                st = pk_err(vm, EM_ERR_FORMAT, "opcode 0x%02x '%c' is not allowed in a state_dict pickle", op, op);
            else st = pk_err(vm, EM_ERR_FORMAT, "opcode 0x%02x is not allowed in a state_dict pickle", op);
            break;
        }
    }
    return st;
}

/* ---- the open file ---------------------------------------------------------------------- */

struct em_pt_file {
    char *path;
    em_pt_entry *e;
    size_t n, cap;
    size_t *by_name; /* indices sorted by name */
    char **keys;     /* storage keys, owned */
};

void em_pt_close(em_pt_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) {
        free((char *)f->e[i].name);
        free((void *)f->e[i].data);
        free((char *)f->e[i].storage_key);
    }
    free(f->e);
    free(f->by_name);
    free(f->path);
    free(f);
}

typedef struct pt_builder {
    const char *file;
    em_pt_file *f;
    const zip_archive *z;
    const char *dir; /* "archive" */
    uint64_t out_bytes, out_limit;
    uint64_t visits, max_visits; /* container items walked, and the bound */
} pt_builder;

/* The storage record "<dir>/data/<key>", read once. */
static em_status pt_record(pt_builder *b, const char *key, zip_entry **out)
{
    char *nm;
    if (asprintf(&nm, "%s/data/%s", b->dir, key) < 0) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", b->file);
    zip_entry *e = zip_find(b->z, nm);
    if (!e) {
        em_status st = em__set_error(EM_ERR_FORMAT, "%s: storage record '%s' is missing from the archive", b->file, nm);
        free(nm);
        return st;
    }
    free(nm);
    if (!e->loaded) {
        em_status st = zip_read(b->file, b->z, e, &e->data, &e->len, &e->owned);
        if (st) return st;
        e->loaded = true;
    }
    *out = e;
    return EM_OK;
}

/* Checks a tensor against its storage and gathers it into C order. */
static em_status pt_add_tensor(pt_builder *b, const char *name, const pv *t)
{
    const pv *s = t->storage;
    size_t es = em_dtype_size(t->dt);
    char sh[200];
    em_shape_str(t->shape, t->ndim, sh, sizeof sh);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->stride[d] < 0)
            return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': negative size or stride (size %s, stride %lld at dim %d)",
                                 b->file, name, sh, (long long)t->stride[d], d);
    if (t->offset < 0)
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': negative storage offset %lld", b->file, name,
                             (long long)t->offset);
    uint64_t snb;
    if (__builtin_mul_overflow((uint64_t)s->numel, (uint64_t)es, &snb))
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': storage of %lld elements overflows", b->file, name,
                             (long long)s->numel);
    zip_entry *r = NULL;
    em_status st = pt_record(b, s->s, &r);
    if (st) return st;
    if (r->len != snb)
        return em__set_error(EM_ERR_FORMAT,
                             "%s: tensor '%s': storage record '%s/data/%s' holds %zu bytes, its %lld elements of %s need %llu",
                             b->file, name, b->dir, s->s, r->len, (long long)s->numel, s->sclass, (unsigned long long)snb);
    int64_t numel = 1, last = t->offset; /* index of the last element reached */
    for (int d = 0; d < t->ndim; d++) {
        if (__builtin_mul_overflow(numel, t->shape[d], &numel))
            return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': shape %s overflows", b->file, name, sh);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)es, &nbytes) || nbytes > SIZE_MAX / 2)
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': shape %s overflows", b->file, name, sh);
    if (numel > 0) {
        for (int d = 0; d < t->ndim; d++) {
            int64_t span;
            if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &span) || __builtin_add_overflow(last, span, &last))
                return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': strides overflow (size %s)", b->file, name, sh);
        }
        if (last >= s->numel)
            return em__set_error(EM_ERR_FORMAT,
                                 "%s: tensor '%s': size %s at storage offset %lld reaches element %lld of a %lld-element "
                                 "storage",
                                 b->file, name, sh, (long long)t->offset, (long long)last, (long long)s->numel);
    } else if (t->offset > s->numel) {
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': storage offset %lld past the %lld-element storage", b->file,
                             name, (long long)t->offset, (long long)s->numel);
    }
    /* stride-0 dims make a view larger than its storage: bounded, so a few bytes cannot ask for terabytes */
    if (nbytes > b->out_limit || b->out_bytes + nbytes > b->out_limit)
        return em__set_error(EM_ERR_FORMAT, "%s: tensor '%s': size %s expands to %llu bytes, above the limit of %llu for this file",
                             b->file, name, sh, (unsigned long long)nbytes, (unsigned long long)b->out_limit);
    b->out_bytes += nbytes;
    if (b->f->n == b->f->cap) {
        size_t cap = b->f->cap ? b->f->cap * 2 : 16;
        em_pt_entry *ne = realloc(b->f->e, cap * sizeof *ne);
        if (!ne) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", b->file);
        b->f->e = ne;
        b->f->cap = cap;
    }
    em_pt_entry *e = &b->f->e[b->f->n];
    memset(e, 0, sizeof *e);
    uint8_t *dst = aligned_alloc64((size_t)nbytes);
    e->name = strdup(name);
    e->storage_key = strdup(s->s);
    if (!dst || !e->name || !e->storage_key) {
        free(dst);
        free((char *)e->name);
        free((char *)e->storage_key);
        return em__set_error(EM_ERR_NOMEM, "%s: tensor '%s': out of memory for %llu bytes", b->file, name,
                             (unsigned long long)nbytes);
    }
    e->dtype = t->dt;
    e->storage_type = s->sclass;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    memcpy(e->stride, t->stride, sizeof e->stride);
    e->numel = numel;
    e->nbytes = (size_t)nbytes;
    e->storage_offset = t->offset;
    e->data = dst;
    b->f->n++;
    if (numel == 0) return EM_OK;
    /* contiguous (C order, dims of size 1 ignored): one copy */
    bool contig = true;
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != want) contig = false;
        want *= t->shape[d];
    }
    const uint8_t *src = r->data + (size_t)t->offset * es;
    if (contig) {
        memcpy(dst, src, (size_t)nbytes);
        return EM_OK;
    }
    int64_t idx[EM_MAX_DIMS] = {0}, off = 0;
    for (int64_t k = 0; k < numel; k++) {
        memcpy(dst + (size_t)k * es, src + (size_t)off * es, es);
        for (int d = t->ndim - 1; d >= 0; d--) { /* odometer */
            off += t->stride[d];
            if (++idx[d] < t->shape[d]) break;
            off -= t->stride[d] * t->shape[d];
            idx[d] = 0;
        }
    }
    return EM_OK;
}

/* Walks the top-level dict: tensors become entries, containers are flattened with "." joins. */
static em_status pt_walk(pt_builder *b, const pv *v, const char *prefix, int depth)
{
    if (v->kind == PK_TENSOR) return pt_add_tensor(b, prefix, v);
    if (v->kind != PK_DICT && v->kind != PK_LIST && v->kind != PK_TUPLE) return EM_OK; /* ints, strings, ...: skipped */
    if (depth > EM_PT_MAX_DEPTH)
        return em__set_error(EM_ERR_FORMAT, "%s: containers nested deeper than %d levels (or a cycle) at '%.200s'", b->file,
                             EM_PT_MAX_DEPTH, prefix);
    for (size_t i = 0; i < v->n; i++) {
        if (++b->visits > b->max_visits) /* containers shared through the memo make a tree walk exponential */
            return em__set_error(EM_ERR_FORMAT,
                                 "%s: more than %llu container items reached (containers shared through the memo): not a "
                                 "state_dict",
                                 b->file, (unsigned long long)b->max_visits);
        const pv *val = v->kind == PK_DICT ? v->items[2 * i + 1] : v->items[i];
        if (val->kind != PK_TENSOR && val->kind != PK_DICT && val->kind != PK_LIST && val->kind != PK_TUPLE) continue;
        char part[64];
        const char *ks = part;
        if (v->kind == PK_DICT) {
            const pv *k = v->items[2 * i];
            if (k->kind == PK_STR) ks = k->s;
            else if (k->kind == PK_INT) snprintf(part, sizeof part, "%lld", (long long)k->i);
            else if (k->kind == PK_BOOL) ks = k->i ? "True" : "False";
            else if (k->kind == PK_NONE) ks = "None";
            else
                return em__set_error(EM_ERR_FORMAT, "%s: a dict key of type %s under '%.200s'", b->file,
                                     pk_kind_name[k->kind], prefix);
        } else {
            snprintf(part, sizeof part, "%zu", i);
        }
        if (strlen(prefix) + strlen(ks) > 65536)
            return em__set_error(EM_ERR_FORMAT, "%s: a flattened key longer than 64 KiB under '%.100s'", b->file, prefix);
        char *key;
        if (asprintf(&key, "%s%s%s", prefix, prefix[0] ? "." : "", ks) < 0)
            return em__set_error(EM_ERR_NOMEM, "%s: out of memory", b->file);
        em_status st = pt_walk(b, val, key, depth + 1);
        free(key);
        if (st) return st;
    }
    return EM_OK;
}

static int cmp_by_name_r(const void *a, const void *b, void *ctx)
{
    const em_pt_file *f = ctx;
    return strcmp(f->e[*(const size_t *)a].name, f->e[*(const size_t *)b].name);
}

em_pt_file *em_pt_open_memory(const void *data, size_t n, const char *name)
{
    if (!name) name = "<memory>";
    if (!data && n) return em__fail(EM_ERR_INVALID, "em_pt_open_memory: data is NULL");
    const uint8_t *d = data;
    if (n >= 2 && d[0] == 0x80 && d[1] <= 5)
        return em__fail(EM_ERR_UNSUPPORTED,
                        "%s: legacy (pre-1.6) torch.save format is not supported; re-save with torch>=1.6", name);
    if (n < 4 || rd32(d) != 0x04034b50)
        return em__fail(EM_ERR_FORMAT, "%s: not a zip archive (torch.save files since torch 1.6 are zip archives)", name);
    zip_archive z;
    if (zip_open(name, d, n, &z)) return NULL;
    /* data.pkl in the archive's one top folder */
    const zip_entry *pkl = NULL;
    bool torchscript = false;
    for (size_t i = 0; i < z.ne; i++) {
        const char *nm = z.e[i].name, *sl = strchr(nm, '/');
        if (sl && !strcmp(sl, "/data.pkl") && !pkl) pkl = &z.e[i];
        if (sl && (!strcmp(sl, "/constants.pkl") || !strncmp(sl, "/code/", 6))) torchscript = true;
    }
    if (torchscript) {
        zip_free(&z);
        return em__fail(EM_ERR_UNSUPPORTED,
                        "%s: a TorchScript archive (torch.jit.save) is not supported; save model.state_dict() with "
                        "torch.save",
                        name);
    }
    if (!pkl) {
        zip_free(&z);
        return em__fail(EM_ERR_FORMAT, "%s: no '<folder>/data.pkl' record: a zip archive but not a torch.save file", name);
    }
    em_pt_file *f = calloc(1, sizeof *f);
    char *dir = strndup(pkl->name, (size_t)(strchr(pkl->name, '/') - pkl->name));
    pt_builder b = {.file = name, .f = f, .z = &z, .dir = dir};
    pk_vm vm = {.file = name};
    em_status st = EM_OK;
    uint8_t *pkl_owned = NULL;
    if (!f || !dir || !(f->path = strdup(name))) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", name);
        goto out;
    }
    /* torch >= 1.10 records the writer's byte order */
    char *bo_name = NULL;
    if (asprintf(&bo_name, "%s/byteorder", dir) < 0) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", name);
        goto out;
    }
    zip_entry *bo = zip_find(&z, bo_name);
    free(bo_name);
    if (bo) {
        const uint8_t *bd;
        size_t bl;
        uint8_t *bown = NULL;
        if ((st = zip_read(name, &z, bo, &bd, &bl, &bown))) goto out;
        bool little = bl == 6 && !memcmp(bd, "little", 6);
        free(bown);
        if (!little) {
            st = em__set_error(EM_ERR_UNSUPPORTED, "%s: written on a big-endian machine (byteorder record is not 'little')",
                               name);
            goto out;
        }
    }
    const uint8_t *pk;
    size_t pklen;
    if ((st = zip_read(name, &z, pkl, &pk, &pklen, &pkl_owned))) goto out;
    vm.p = pk;
    vm.n = pklen;
    pv *root = NULL;
    if ((st = pk_run(&vm, &root))) goto out;
    if (root->kind != PK_DICT) {
        st = em__set_error(EM_ERR_FORMAT, "%s: data.pkl holds a %s, not a dict (a state_dict or a checkpoint dict)", name,
                           pk_kind_name[root->kind]);
        goto out;
    }
    b.out_limit = (uint64_t)n * 64 + ((uint64_t)16 << 20);
    b.max_visits = (uint64_t)pklen * 4 + 4096; /* a tree has at most one container slot per pickle byte */
    if ((st = pt_walk(&b, root, "", 0))) goto out;
    f->by_name = malloc((f->n ? f->n : 1) * sizeof *f->by_name);
    if (!f->by_name) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", name);
        goto out;
    }
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, f->n, sizeof *f->by_name, cmp_by_name_r, f);
    for (size_t i = 1; i < f->n; i++)
        if (!strcmp(f->e[f->by_name[i - 1]].name, f->e[f->by_name[i]].name)) {
            st = em__set_error(EM_ERR_FORMAT, "%s: two tensors with the flattened key '%s'", name, f->e[f->by_name[i]].name);
            goto out;
        }
out:
    pk_free_all(&vm);
    free(pkl_owned);
    free(dir);
    zip_free(&z);
    if (st) {
        em_pt_close(f);
        return NULL;
    }
    return f;
}

em_pt_file *em_pt_open(const char *path)
{
    if (!path) return em__fail(EM_ERR_INVALID, "em_pt_open: path is NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) return em__fail(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return em__fail(EM_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        fclose(fp);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory for %zu bytes", path, n);
    }
    if (n && fread(buf, 1, n, fp) != n) {
        int e = ferror(fp) ? errno : 0;
        free(buf);
        fclose(fp);
        return em__fail(EM_ERR_IO, "%s: read error: %s", path, e ? strerror(e) : "file shrank while reading");
    }
    fclose(fp);
    em_pt_file *f = em_pt_open_memory(buf, n, path);
    free(buf);
    return f;
}

size_t em_pt_count(const em_pt_file *f) { return f ? f->n : 0; }

const em_pt_entry *em_pt_at(const em_pt_file *f, size_t i)
{
    if (!f) return em__fail(EM_ERR_INVALID, "em_pt_at: file is NULL");
    if (i >= f->n) return em__fail(EM_ERR_INVALID, "%s: tensor index %zu out of range (%zu tensors)", f->path, i, f->n);
    return &f->e[i];
}

const char *em_pt_name(const em_pt_file *f, size_t i)
{
    const em_pt_entry *e = em_pt_at(f, i);
    return e ? e->name : NULL;
}

static const em_pt_entry *pt_find(const em_pt_file *f, const char *name)
{
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->e[f->by_name[mid]].name, name);
        if (c == 0) return &f->e[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const em_pt_entry *em_pt_find(const em_pt_file *f, const char *name)
{
    if (!f || !name) return em__fail(EM_ERR_INVALID, "em_pt_find: file or name is NULL");
    const em_pt_entry *e = pt_find(f, name);
    if (!e) return em__fail(EM_ERR_INVALID, "%s: no tensor '%s' in the file", f->path, name);
    return e;
}

em_tensor *em_pt_tensor(const em_pt_file *f, size_t i)
{
    const em_pt_entry *e = em_pt_at(f, i);
    if (!e) return NULL;
    return em_from_host(e->data, e->shape, e->ndim, e->dtype);
}

/* ---- key remapping ------------------------------------------------------------------------ */

typedef struct pt_rule {
    regex_t re;
    const char *repl;
    char *pat;
    bool compiled;
    size_t ngroups;
} pt_rule;

static void rules_free(pt_rule *r, int n)
{
    if (!r) return;
    for (int i = 0; i < n; i++) {
        if (r[i].compiled) regfree(&r[i].re);
        free(r[i].pat);
    }
    free(r);
}

/* The first '=' outside a bracket expression and not after a backslash. */
static const char *rule_split(const char *r)
{
    for (const char *p = r; *p; p++) {
        if (*p == '\\' && p[1]) p++;
        else if (*p == '[') {
            p++;
            if (*p == '^') p++;
            if (*p == ']') p++; /* a leading ']' is a member */
            while (*p && *p != ']') p++;
            if (!*p) return NULL;
        } else if (*p == '=') return p;
    }
    return NULL;
}

static em_status rules_compile(const char *const rules[], int nrules, pt_rule **out)
{
    *out = NULL;
    if (nrules < 0 || (nrules && !rules)) return em__set_error(EM_ERR_INVALID, "key rules: NULL list or negative count");
    pt_rule *r = calloc(nrules ? (size_t)nrules : 1, sizeof *r);
    if (!r) return em__set_error(EM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nrules; i++) {
        const char *eq = rules[i] ? rule_split(rules[i]) : NULL;
        if (!eq) {
            rules_free(r, nrules);
            return em__set_error(EM_ERR_INVALID, "key rule %d '%s' is not PATTERN=REPLACEMENT", i + 1,
                                 rules[i] ? rules[i] : "(null)");
        }
        r[i].pat = strndup(rules[i], (size_t)(eq - rules[i]));
        r[i].repl = eq + 1;
        if (!r[i].pat) {
            rules_free(r, nrules);
            return em__set_error(EM_ERR_NOMEM, "out of memory");
        }
        int rc = regcomp(&r[i].re, r[i].pat, REG_EXTENDED);
        if (rc) {
            char why[200];
            regerror(rc, &r[i].re, why, sizeof why);
            em_status st = em__set_error(EM_ERR_INVALID, "key rule %d '%s': bad regex '%s': %s", i + 1, rules[i], r[i].pat, why);
            rules_free(r, nrules);
            return st;
        }
        r[i].compiled = true;
        r[i].ngroups = r[i].re.re_nsub;
        for (const char *p = r[i].repl; *p; p++)
            if (*p == '\\' && p[1]) {
                if (p[1] >= '1' && p[1] <= '9' && (size_t)(p[1] - '0') > r[i].ngroups) {
                    em_status st = em__set_error(EM_ERR_INVALID, "key rule %d '%s': \\%c but the pattern has %zu group%s",
                                                 i + 1, rules[i], p[1], r[i].ngroups, r[i].ngroups == 1 ? "" : "s");
                    rules_free(r, nrules);
                    return st;
                }
                p++;
            }
    }
    *out = r;
    return EM_OK;
}

/* Appends to a growing string; false when out of memory. */
typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static bool sb_add(sbuf *b, const char *p, size_t k)
{
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + k + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return false;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, k);
    b->n += k;
    b->s[b->n] = 0;
    return true;
}

/* One rule on key: every non-overlapping match replaced; a new string in *out. */
static bool rule_apply(const pt_rule *r, const char *key, char **out)
{
    sbuf b = {0};
    regmatch_t m[10];
    size_t pos = 0, len = strlen(key);
    if (!sb_add(&b, "", 0)) return false;
    while (pos <= len) {
        if (regexec(&r->re, key + pos, 10, m, pos ? REG_NOTBOL : 0) != 0) break;
        size_t ms = pos + (size_t)m[0].rm_so, me = pos + (size_t)m[0].rm_eo;
        if (!sb_add(&b, key + pos, ms - pos)) goto oom;
        for (const char *p = r->repl; *p; p++) {
            if (*p == '\\' && p[1] >= '0' && p[1] <= '9') {
                int g = p[1] - '0';
                if (m[g].rm_so >= 0 && !sb_add(&b, key + pos + m[g].rm_so, (size_t)(m[g].rm_eo - m[g].rm_so))) goto oom;
                p++;
            } else if (*p == '\\' && p[1] == '\\') {
                if (!sb_add(&b, "\\", 1)) goto oom;
                p++;
            } else if (!sb_add(&b, p, 1)) goto oom;
        }
        if (me == ms) { /* empty match: copy one character and move on */
            if (ms < len && !sb_add(&b, key + ms, 1)) goto oom;
            pos = ms + 1;
        } else {
            pos = me;
        }
    }
    if (pos < len && !sb_add(&b, key + pos, len - pos)) goto oom;
    *out = b.s;
    return true;
oom:
    free(b.s);
    return false;
}

/* All rules in order; a new string (NULL when out of memory). */
static char *rules_apply(const pt_rule *r, int nrules, const char *key)
{
    char *cur = strdup(key);
    for (int i = 0; cur && i < nrules; i++) {
        char *next = NULL;
        if (!rule_apply(&r[i], cur, &next)) next = NULL;
        free(cur);
        cur = next;
    }
    return cur;
}

em_status em_pt_remap_key(const char *const rules[], int nrules, const char *key, char *out, size_t n)
{
    if (!key || !out || !n) return em__set_error(EM_ERR_INVALID, "em_pt_remap_key: key or out is NULL");
    pt_rule *r;
    em_status st = rules_compile(rules, nrules, &r);
    if (st) return st;
    char *s = rules_apply(r, nrules, key);
    rules_free(r, nrules);
    if (!s) return em__set_error(EM_ERR_NOMEM, "out of memory");
    if (strlen(s) >= n) {
        st = em__set_error(EM_ERR_INVALID, "key '%s' remapped to %zu bytes, above the %zu-byte buffer", key, strlen(s), n);
        free(s);
        return st;
    }
    memcpy(out, s, strlen(s) + 1);
    free(s);
    return EM_OK;
}

/* ---- load into a module ---------------------------------------------------------------------- */

typedef struct mod_keys {
    char **names;
    em_tensor **ts;
    size_t n, cap;
    bool oom;
} mod_keys;

static void collect_key(const char *key, em_tensor *t, void *ud)
{
    mod_keys *c = ud;
    if (c->oom) return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 32;
        char **nn = realloc(c->names, cap * sizeof *nn);
        if (nn) c->names = nn;
        em_tensor **nt = realloc(c->ts, cap * sizeof *nt);
        if (nt) c->ts = nt;
        if (!nn || !nt) {
            c->oom = true;
            return;
        }
        c->cap = cap;
    }
    c->names[c->n] = strdup(key);
    if (!c->names[c->n]) {
        c->oom = true;
        return;
    }
    c->ts[c->n++] = em_tensor_retain(t);
}

static void list_add(char *buf, size_t cap, int *count, const char *name)
{
    size_t len = strlen(buf), nl = strlen(name);
    (*count)++;
    if (len >= 3 && strcmp(buf + len - 3, "...") == 0) return;
    if (len + nl + 4 + 6 < cap) snprintf(buf + len, cap - len, "%s'%s'", len ? ", " : "", name);
    else if (len + 6 < cap) snprintf(buf + len, cap - len, "%s", len ? ", ..." : "...");
}

static int cmp_mapped_r(const void *a, const void *b, void *ctx)
{
    char **mapped = ctx;
    return strcmp(mapped[*(const size_t *)a], mapped[*(const size_t *)b]);
}

em_status em_pt_load_from(em_module *m, const em_pt_file *f, const char *const rules[], int nrules, bool strict)
{
    if (!m || !f) return em__set_error(EM_ERR_INVALID, "em_pt_load_from: %s is NULL", !m ? "module" : "file");
    const char *file = f->path;
    pt_rule *r = NULL;
    em_status st = rules_compile(rules, nrules, &r);
    if (st) {
        char why[600];
        snprintf(why, sizeof why, "%s", em_last_error());
        return em__set_error(st, "%s: %s", file, why);
    }
    mod_keys mk = {0};
    char **mapped = calloc(f->n ? f->n : 1, sizeof *mapped);
    size_t *src_of = NULL; /* per module key: file entry index, or SIZE_MAX */
    size_t *order = NULL;  /* file entries by mapped name */
    if (!mapped) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
        goto out;
    }
    for (size_t i = 0; i < f->n; i++)
        if (!(mapped[i] = rules_apply(r, nrules, f->e[i].name))) {
            st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
            goto out;
        }
    order = malloc((f->n ? f->n : 1) * sizeof *order);
    if (!order) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
        goto out;
    }
    for (size_t i = 0; i < f->n; i++) order[i] = i;
    qsort_r(order, f->n, sizeof *order, cmp_mapped_r, mapped);
    for (size_t i = 1; i < f->n; i++)
        if (!strcmp(mapped[order[i - 1]], mapped[order[i]])) {
            size_t x = order[i - 1] < order[i] ? order[i - 1] : order[i], y = order[i - 1] ^ order[i] ^ x;
            st = em__set_error(EM_ERR_INVALID, "%s: file keys '%s' and '%s' both remap to '%s'", file, f->e[x].name,
                               f->e[y].name, mapped[x]);
            goto out;
        }
    if ((st = em_module_visit_params(m, collect_key, &mk)) == EM_OK) st = em_module_visit_buffers(m, collect_key, &mk);
    if (st == EM_OK && mk.oom) st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    if (st) goto out;
    src_of = malloc((mk.n ? mk.n : 1) * sizeof *src_of);
    bool *used = calloc(f->n ? f->n : 1, sizeof *used);
    if (!src_of || !used) {
        free(used);
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
        goto out;
    }
    char missing[768] = "", unexpected[768] = "";
    int nmiss = 0, nunexp = 0;
    for (size_t k = 0; k < mk.n; k++) {
        src_of[k] = SIZE_MAX;
        size_t lo = 0, hi = f->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(mapped[order[mid]], mk.names[k]);
            if (c == 0) {
                src_of[k] = order[mid];
                used[order[mid]] = true;
                break;
            }
            if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        if (src_of[k] == SIZE_MAX) list_add(missing, sizeof missing, &nmiss, mk.names[k]);
    }
    for (size_t i = 0; i < f->n; i++)
        if (!used[i]) list_add(unexpected, sizeof unexpected, &nunexp, mapped[i]);
    free(used);
    if (strict && (nmiss || nunexp)) {
        char a[900] = "", b2[900] = "";
        if (nmiss) snprintf(a, sizeof a, "%d key%s missing from the file: %s", nmiss, nmiss > 1 ? "s" : "", missing);
        if (nunexp)
            snprintf(b2, sizeof b2, "%d unexpected key%s in the file (not in the model%s): %s", nunexp,
                     nunexp > 1 ? "s" : "", nrules ? ", after remapping" : "", unexpected);
        st = em__set_error(EM_ERR_FORMAT, "%s: %s%s%s", file, a, nmiss && nunexp ? "; " : "", b2);
        goto out;
    }
    for (size_t k = 0; k < mk.n; k++) {
        if (src_of[k] == SIZE_MAX) continue;
        const em_pt_entry *e = &f->e[src_of[k]];
        const em_tensor *dst = mk.ts[k];
        int nd = em_tensor_ndim(dst);
        const int64_t *sh = em_tensor_shape(dst);
        bool same = nd == e->ndim;
        for (int d = 0; same && d < nd; d++) same = sh[d] == e->shape[d];
        char via[300] = "";
        if (strcmp(e->name, mk.names[k])) snprintf(via, sizeof via, " (file key '%s')", e->name);
        if (!same) {
            char s1[160], s2[160];
            em_shape_str(e->shape, e->ndim, s1, sizeof s1);
            em_shape_str(sh, nd, s2, sizeof s2);
            st = em__set_error(EM_ERR_SHAPE, "%s: key '%s'%s: shape %s in file, %s in model", file, mk.names[k], via, s1, s2);
            goto out;
        }
        if (em_tensor_dtype(dst) != e->dtype) {
            st = em__set_error(EM_ERR_DTYPE, "%s: key '%s'%s: dtype %s in file, %s in model", file, mk.names[k], via,
                               em_dtype_name(e->dtype), em_dtype_name(em_tensor_dtype(dst)));
            goto out;
        }
    }
    /* all checked: build every source, then copy */
    em_scope_begin();
    em_tensor **src = calloc(mk.n ? mk.n : 1, sizeof *src);
    if (!src) st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", file);
    for (size_t k = 0; src && k < mk.n && st == EM_OK; k++) {
        if (src_of[k] == SIZE_MAX) continue;
        const em_pt_entry *e = &f->e[src_of[k]];
        src[k] = em_from_host(e->data, e->shape, e->ndim, e->dtype);
        if (!src[k]) st = em_last_status() < 0 ? em_last_status() : EM_ERR_RUNTIME;
    }
    for (size_t k = 0; src && k < mk.n && st == EM_OK; k++) {
        if (!src[k]) continue;
        st = em_copy_(mk.ts[k], src[k]);
        if (st != EM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", em_last_error());
            st = em__set_error(st, "%s: key '%s': %s", file, mk.names[k], why);
        }
    }
    free(src);
    em_scope_end();
out:
    if (mapped)
        for (size_t i = 0; i < f->n; i++) free(mapped[i]);
    free(mapped);
    free(src_of);
    free(order);
    for (size_t k = 0; k < mk.n; k++) {
        free(mk.names[k]);
        em_tensor_release(mk.ts[k]);
    }
    free(mk.names);
    free(mk.ts);
    rules_free(r, nrules);
    return st;
}

em_status em_pt_load_into(em_module *m, const char *path, const char *const rules[], int nrules, bool strict)
{
    if (!m || !path) return em__set_error(EM_ERR_INVALID, "em_pt_load_into: %s is NULL", !m ? "module" : "path");
    em_pt_file *f = em_pt_open(path);
    if (!f) return em_last_status() < 0 ? em_last_status() : EM_ERR_IO;
    em_status st = em_pt_load_from(m, f, rules, nrules, strict);
    em_pt_close(f);
    return st;
}
