/* NumPy .npy files (format versions 1.0, 2.0 and 3.0): read and write one
 * array. Format reference: numpy/lib/format.py's documentation ("NPY
 * format"): magic "\x93NUMPY", major, minor, a little-endian header length
 * (2 bytes in 1.0, 4 in 2.0/3.0), then a Python dict literal with 'descr',
 * 'fortran_order' and 'shape', padded with spaces and a newline, then the
 * data in C or Fortran order. */
#define _GNU_SOURCE
#include "ember/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "store/npy.c assumes a little-endian host"
#endif

static const struct {
    const char *descr;
    em_dtype dt;
} npy_types[] = {
    {"<f4", EM_F32}, {"<f8", EM_F64}, {"<f2", EM_F16}, {"<i4", EM_I32}, {"<i8", EM_I64},
    {"|u1", EM_U8},  {"|b1", EM_BOOL}, {"<u1", EM_U8}, {"<b1", EM_BOOL},
};

/* Finds 'key' in the header dict and returns a pointer just after its ':'. */
static const char *find_key(const char *h, const char *key)
{
    char pat[32];
    const char *p;
    snprintf(pat, sizeof pat, "'%s'", key);
    if (!(p = strstr(h, pat))) {
        snprintf(pat, sizeof pat, "\"%s\"", key);
        if (!(p = strstr(h, pat))) return NULL;
    }
    p += strlen(pat);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

em_tensor *em_npy_load(const char *path)
{
    if (!path) {
        em_set_error(EM_ERR_INVALID, "em_npy_load: path is NULL");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        em_set_error(EM_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    uint8_t pre[12];
    char *h = NULL, *buf = NULL;
    em_tensor *t = NULL;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        em_set_error(EM_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6)) {
        em_set_error(EM_ERR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", path);
        goto out;
    }
    unsigned major = pre[6];
    uint64_t hlen;
    long data_at;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        data_at = 10;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            em_set_error(EM_ERR_FORMAT, "%s: truncated .npy header", path);
            goto out;
        }
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
        data_at = 12;
    } else {
        em_set_error(EM_ERR_FORMAT, "%s: .npy format version %u is not supported (1, 2 or 3)", path, major);
        goto out;
    }
    if (hlen > 65536 || (uint64_t)sb.st_size < (uint64_t)data_at + hlen) {
        em_set_error(EM_ERR_FORMAT, "%s: .npy header of %llu bytes does not fit the file", path, (unsigned long long)hlen);
        goto out;
    }
    h = malloc(hlen + 1);
    if (!h || fread(h, 1, hlen, f) != hlen) {
        em_set_error(h ? EM_ERR_IO : EM_ERR_NOMEM, "%s: cannot read the .npy header", path);
        goto out;
    }
    h[hlen] = 0;
    data_at += (long)hlen;
    const char *d = find_key(h, "descr"), *fo = find_key(h, "fortran_order"), *sh = find_key(h, "shape");
    if (!d || !fo || !sh || (*d != '\'' && *d != '"') || *sh != '(') {
        em_set_error(EM_ERR_FORMAT, "%s: .npy header lacks descr, fortran_order or shape: %.120s", path, h);
        goto out;
    }
    char descr[16] = {0};
    {
        char q = *d++;
        size_t i = 0;
        while (*d && *d != q && i + 1 < sizeof descr) descr[i++] = *d++;
    }
    em_dtype dt = EM_DTYPE_COUNT;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (!strcmp(npy_types[i].descr, descr)) dt = npy_types[i].dt;
    if (dt == EM_DTYPE_COUNT) {
        em_set_error(EM_ERR_UNSUPPORTED, "%s: .npy dtype '%s' is not supported (<f4 <f8 <f2 <i4 <i8 |u1 |b1)", path, descr);
        goto out;
    }
    if (!strncmp(fo, "True", 4)) {
        em_set_error(EM_ERR_UNSUPPORTED, "%s: Fortran-order .npy arrays are not supported (save with np.ascontiguousarray)", path);
        goto out;
    }
    int64_t shape[EM_MAX_DIMS];
    int nd = 0;
    uint64_t numel = 1;
    const char *p = sh + 1;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0) {
            em_set_error(EM_ERR_FORMAT, "%s: bad .npy shape %.60s", path, sh);
            goto out;
        }
        if (nd == EM_MAX_DIMS) {
            em_set_error(EM_ERR_UNSUPPORTED, "%s: .npy rank above Ember's %d", path, EM_MAX_DIMS);
            goto out;
        }
        shape[nd++] = v;
        if (v && numel > ((uint64_t)1 << 40) / (uint64_t)v) {
            em_set_error(EM_ERR_FORMAT, "%s: .npy shape %.60s is too large", path, sh);
            goto out;
        }
        numel *= (uint64_t)v;
        p = end;
    }
    size_t nbytes = (size_t)numel * em_dtype_size(dt);
    if ((uint64_t)sb.st_size - (uint64_t)data_at != nbytes) {
        em_set_error(EM_ERR_FORMAT, "%s: .npy data is %lld bytes, shape and dtype need %zu", path,
                     (long long)((uint64_t)sb.st_size - (uint64_t)data_at), nbytes);
        goto out;
    }
    buf = malloc(nbytes ? nbytes : 1);
    if (!buf) {
        em_set_error(EM_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, nbytes);
        goto out;
    }
    if (fseek(f, data_at, SEEK_SET) != 0 || (nbytes && fread(buf, 1, nbytes, f) != nbytes)) {
        em_set_error(EM_ERR_IO, "%s: short read", path);
        goto out;
    }
    if (dt == EM_BOOL)
        for (size_t i = 0; i < nbytes; i++) buf[i] = buf[i] != 0;
    t = em_from_host(buf, shape, nd, dt);
out:
    free(buf);
    free(h);
    fclose(f);
    return t;
}

em_status em_npy_save(const char *path, const em_tensor *t)
{
    if (!path || !t) return em_set_error(EM_ERR_INVALID, "em_npy_save: %s is NULL", path ? "tensor" : "path");
    em_dtype dt = em_tensor_dtype(t);
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0] && !descr; i++)
        if (npy_types[i].dt == dt) descr = npy_types[i].descr;
    if (!descr) return em_set_error(EM_ERR_DTYPE, "em_npy_save: %s has no .npy dtype here (bf16: cast first)", em_dtype_name(dt));
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < em_tensor_ndim(t); d++)
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%lld,%s", (long long)em_tensor_dim(t, d),
                      d + 1 < em_tensor_ndim(t) ? " " : "");
    if (em_tensor_ndim(t) > 1) n--; /* numpy writes (2, 3), but (4,) for one dim */
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "), }");
    /* pad with spaces so that magic + version + length + header + '\n' is a multiple of 64 */
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    memset(hdr + n, ' ', (size_t)pad);
    n += pad;
    hdr[n++] = '\n';
    size_t nbytes = (size_t)em_tensor_numel(t) * em_dtype_size(dt);
    uint8_t *data = malloc(nbytes ? nbytes : 1);
    if (!data) return em_set_error(EM_ERR_NOMEM, "em_npy_save: cannot allocate %zu bytes", nbytes);
    em_status st = nbytes ? em_to_host(t, data, nbytes) : EM_OK;
    if (st != EM_OK) {
        free(data);
        return st;
    }
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0) {
        free(data);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = em_set_error(EM_ERR_IO, "%s: cannot create a temporary file: %s", path, strerror(errno));
        free(tmp);
        free(data);
        return st;
    }
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(n & 0xff), (uint8_t)(n >> 8)};
    FILE *f = fdopen(fd, "wb");
    bool ok = f && fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n &&
              (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f) ok = (fclose(f) == 0) && ok;
    else close(fd);
    free(data);
    if (!ok || rename(tmp, path) != 0) {
        st = em_set_error(EM_ERR_IO, "%s: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return st;
}
