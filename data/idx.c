/* IDX reader (LeCun's MNIST file format), plain or gzip, and the MNIST dataset.
 *
 * Format: a 4-byte big-endian magic 0x0000TTNN (TT element type, NN rank),
 * NN big-endian u32 sizes, then the elements in C order, big-endian. */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/data.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static size_t idx_type_size(int type)
{
    switch (type) {
    case EM_IDX_U8:
    case EM_IDX_I8: return 1;
    case EM_IDX_I16: return 2;
    case EM_IDX_I32:
    case EM_IDX_F32: return 4;
    case EM_IDX_F64: return 8;
    default: return 0;
    }
}

/* zlib's message without the "path: " it starts with. */
static const char *gz_msg(const char *msg, const char *path)
{
    if (!msg) return "?";
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ' ? msg + n + 2 : msg;
}

/* Reads up to n bytes; returns bytes read, or -1 (message set) on a stream error. */
static int64_t gz_read_full(gzFile f, const char *path, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got;
        if (chunk > (1u << 20)) chunk = 1u << 20;
        int r = gzread(f, (char *)buf + got, (unsigned)chunk);
        if (r < 0) {
            int errnum = 0;
            const char *msg = gzerror(f, &errnum);
            if (errnum == Z_ERRNO)
                em__set_error(EM_ERR_IO, "%s: read error: %s", path, strerror(errno));
            else
                em__set_error(EM_ERR_FORMAT, "%s: corrupt gzip stream: %s", path, gz_msg(msg, path));
            return -1;
        }
        if (r == 0) {
            int errnum = 0;
            const char *msg = gzerror(f, &errnum);
            if (errnum == Z_BUF_ERROR) {
                /* the compressed stream stops before its end-of-stream marker
                 * and trailer: data missing, or at least the CRC-32 that
                 * checks it (Python's gzip refuses such files too) */
                (void)msg;
                em__set_error(EM_ERR_FORMAT, "%s: truncated: the gzip stream ends before its end (compressed file cut short)",
                              path);
                return -1;
            }
            if (errnum != Z_OK) {
                em__set_error(EM_ERR_FORMAT, "%s: corrupt gzip stream: %s", path, gz_msg(msg, path));
                return -1;
            }
            break; /* end of data */
        }
        got += (size_t)r;
    }
    return (int64_t)got;
}

static const char *idx_what(uint32_t expected_magic)
{
    if (expected_magic == EM_IDX_MAGIC_IMAGES) return "bytes of pixels";
    if (expected_magic == EM_IDX_MAGIC_LABELS) return "bytes of labels";
    return "bytes of data";
}

static void bswap_inplace(void *data, int64_t numel, size_t es)
{
    uint8_t *p = data;
    if (es == 1) return;
    for (int64_t i = 0; i < numel; i++, p += es) {
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
    }
}

em_status em_idx_read(const char *path, uint32_t expected_magic, em_idx *out)
{
    if (!path || !out) return em__set_error(EM_ERR_INVALID, "em_idx_read: path or out is NULL");
    memset(out, 0, sizeof *out);
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        return em__set_error(EM_ERR_IO, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    gzbuffer(f, 1u << 17);
    em_status st = EM_OK;
    uint8_t *data = NULL;
    uint8_t hdr[4];
    int64_t r = gz_read_full(f, path, hdr, 4);
    if (r < 0) {
        st = em_last_status();
        goto done;
    }
    if (r < 4) {
        st = em__set_error(EM_ERR_FORMAT, "%s: truncated: %lld bytes, shorter than the 4-byte IDX magic", path,
                           (long long)r);
        goto done;
    }
    uint32_t magic = ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) | ((uint32_t)hdr[2] << 8) | hdr[3];
    if (expected_magic && magic != expected_magic) {
        st = em__set_error(EM_ERR_FORMAT, "%s: wrong magic number 0x%08x, expected 0x%08x (IDX %s with %u dims)",
                           path, magic, expected_magic,
                           ((expected_magic >> 8) & 0xff) == EM_IDX_U8 ? "u8" : "data", expected_magic & 0xff);
        goto done;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        st = em__set_error(EM_ERR_FORMAT, "%s: bad magic number 0x%08x: not an IDX file (first two bytes must be 0)",
                           path, magic);
        goto done;
    }
    int type = hdr[2], ndim = hdr[3];
    size_t es = idx_type_size(type);
    if (!es) {
        st = em__set_error(EM_ERR_FORMAT, "%s: unknown IDX element type 0x%02x in magic 0x%08x", path, type, magic);
        goto done;
    }
    if (ndim < 1 || ndim > EM_MAX_DIMS) {
        st = em__set_error(EM_ERR_FORMAT, "%s: IDX rank %d outside [1, %d]", path, ndim, EM_MAX_DIMS);
        goto done;
    }
    uint8_t dimbuf[4 * EM_MAX_DIMS];
    r = gz_read_full(f, path, dimbuf, 4 * (size_t)ndim);
    if (r < 0) {
        st = em_last_status();
        goto done;
    }
    if (r < 4 * ndim) {
        st = em__set_error(EM_ERR_FORMAT, "%s: truncated header: expected %d bytes of dimensions, got %lld", path,
                           4 * ndim, (long long)r);
        goto done;
    }
    out->magic = magic;
    out->type = type;
    out->elem_size = es;
    out->ndim = ndim;
    int64_t numel = 1;
    int overflow_at = -1;
    for (int i = 0; i < ndim; i++) {
        const uint8_t *d = dimbuf + 4 * i;
        int64_t v = ((int64_t)d[0] << 24) | ((int64_t)d[1] << 16) | ((int64_t)d[2] << 8) | d[3];
        out->dims[i] = v;
        if (overflow_at < 0 && v && numel > (INT64_MAX / 16) / v) overflow_at = i;
        else if (overflow_at < 0) numel *= v;
    }
    for (int i = 0; i < ndim; i++)
        if (out->dims[i] == 0) numel = 0, overflow_at = -1; /* an empty array, whatever the other sizes */
    if (overflow_at >= 0) {
        st = em__set_error(EM_ERR_FORMAT,
                           "%s: IDX sizes overflow: the product of the %d dimensions exceeds 2^59 elements at dimension "
                           "%d (%lld)",
                           path, ndim, overflow_at, (long long)out->dims[overflow_at]);
        goto done;
    }
    size_t expected = (size_t)numel * es;
    /* Grow the buffer with the data actually read, so a lying header cannot
     * make us allocate more than twice what the file holds. */
    size_t cap = expected < (1u << 20) ? expected : (1u << 20), got = 0;
    data = malloc(cap ? cap : 1);
    if (!data) {
        st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    while (got < expected) {
        if (got == cap) {
            size_t ncap = cap * 2 < expected ? cap * 2 : expected;
            uint8_t *nd = realloc(data, ncap);
            if (!nd) {
                st = em__set_error(EM_ERR_NOMEM, "%s: out of memory for %zu bytes", path, ncap);
                goto done;
            }
            data = nd;
            cap = ncap;
        }
        r = gz_read_full(f, path, data + got, cap - got);
        if (r < 0) {
            st = em_last_status();
            goto done;
        }
        got += (size_t)r;
        if (got < cap) break; /* end of file */
    }
    if (got < expected) {
        st = em__set_error(EM_ERR_FORMAT, "%s: truncated: expected %zu %s, got %zu", path, expected,
                           idx_what(expected_magic ? expected_magic : 0), got);
        goto done;
    }
    uint8_t extra[256];
    r = gz_read_full(f, path, extra, sizeof extra);
    if (r < 0) {
        st = em_last_status();
        goto done;
    }
    if (r > 0) {
        st = em__set_error(EM_ERR_FORMAT, "%s: %s%lld bytes after the %zu bytes of data that the header announces",
                           path, r == (int64_t)sizeof extra ? "at least " : "", (long long)r, expected);
        goto done;
    }
    bswap_inplace(data, numel, es); /* big-endian -> host (x86/ARM are little-endian) */
    out->numel = numel;
    out->data = data;
    out->nbytes = expected;
    data = NULL;
done:
    free(data);
    gzclose(f);
    if (st != EM_OK) memset(out, 0, sizeof *out);
    return st;
}

void em_idx_free(em_idx *idx)
{
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* ---- MNIST dataset -------------------------------------------------------------- */

typedef struct mnist_ds {
    em_dataset base;
    int64_t n;
    uint8_t *pixels; /* [n, rows*cols] */
    uint8_t *labels; /* [n] */
} mnist_ds;

static int64_t mnist_length(const em_dataset *ds) { return ((const mnist_ds *)ds)->n; }

static em_status mnist_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    const mnist_ds *m = (const mnist_ds *)ds;
    int64_t nf = ds->num_features;
    const uint8_t *p = m->pixels + i * nf;
    for (int64_t k = 0; k < nf; k++) x[k] = (float)p[k] / 255.0f; /* as torchvision ToTensor */
    *y = m->labels[i];
    return EM_OK;
}

static void mnist_free(em_dataset *ds)
{
    mnist_ds *m = (mnist_ds *)ds;
    free(m->pixels);
    free(m->labels);
    free(m);
}

static const em_dataset_vtable mnist_vt = {mnist_length, mnist_get, mnist_free};

em_dataset *em_mnist_open_files(const char *images_path, const char *labels_path)
{
    if (!images_path || !labels_path) return em__fail(EM_ERR_INVALID, "em_mnist_open_files: path is NULL");
    em_idx img, lab;
    if (em_idx_read(images_path, EM_IDX_MAGIC_IMAGES, &img) != EM_OK) return NULL;
    if (em_idx_read(labels_path, EM_IDX_MAGIC_LABELS, &lab) != EM_OK) {
        em_idx_free(&img);
        return NULL;
    }
    if (img.dims[0] != lab.dims[0]) {
        em__set_error(EM_ERR_FORMAT, "%s has %lld labels but %s has %lld images", labels_path,
                      (long long)lab.dims[0], images_path, (long long)img.dims[0]);
        goto fail;
    }
    if (img.dims[1] < 1 || img.dims[2] < 1) {
        em__set_error(EM_ERR_FORMAT, "%s: empty images (%lld x %lld)", images_path, (long long)img.dims[1],
                      (long long)img.dims[2]);
        goto fail;
    }
    mnist_ds *m = calloc(1, sizeof *m);
    if (!m) {
        em__set_error(EM_ERR_NOMEM, "em_mnist_open: out of memory");
        goto fail;
    }
    int64_t maxl = -1;
    const uint8_t *lp = lab.data;
    for (int64_t i = 0; i < lab.numel; i++)
        if (lp[i] > maxl) maxl = lp[i];
    int64_t fshape[3] = {1, img.dims[1], img.dims[2]};
    if (em_dataset_init(&m->base, &mnist_vt, fshape, 3, maxl + 1) != EM_OK) {
        free(m);
        goto fail;
    }
    m->n = img.dims[0];
    m->pixels = img.data;
    m->labels = lab.data;
    return &m->base;
fail:
    em_idx_free(&img);
    em_idx_free(&lab);
    return NULL;
}

/* First existing file among dir/prefix{-,.}kind-ubyte{.gz,}; malloc'd path or NULL. */
static char *find_mnist_file(const char *dir, const char *prefix, const char *kind)
{
    static const char *const seps[] = {"-", "."};
    static const char *const exts[] = {".gz", ""};
    for (int s = 0; s < 2; s++)
        for (int e = 0; e < 2; e++) {
            char *p = NULL;
            if (asprintf(&p, "%s/%s%s%s-ubyte%s", dir, prefix, seps[s], kind, exts[e]) < 0) return NULL;
            if (access(p, R_OK) == 0) return p;
            free(p);
        }
    return NULL;
}

em_dataset *em_mnist_open(const char *dir, bool train)
{
    if (!dir) dir = EM_FASHION_MNIST_DIR;
    const char *prefix = train ? "train" : "t10k";
    char *img = find_mnist_file(dir, prefix, "images-idx3");
    if (!img)
        return em__fail(EM_ERR_IO, "%s: no readable %s-images-idx3-ubyte[.gz] in this directory", dir, prefix);
    char *lab = find_mnist_file(dir, prefix, "labels-idx1");
    if (!lab) {
        free(img);
        return em__fail(EM_ERR_IO, "%s: no readable %s-labels-idx1-ubyte[.gz] in this directory", dir, prefix);
    }
    em_dataset *ds = em_mnist_open_files(img, lab);
    free(img);
    free(lab);
    return ds;
}
