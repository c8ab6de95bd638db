/* Tests of store/pt.c: PyTorch checkpoints (torch.save zip + pickle).
 * Fixtures: tests/fixtures/pt_*.pt written by make_pt_fixtures.py with
 * Debian's torch, and pt_expect.safetensors (the same tensors, contiguous,
 * and the MLP's output computed by torch). Malicious and damaged files are
 * built here, byte by byte. */
#define _GNU_SOURCE
#include "testutil.h"

#include "ember/store.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

static const char *fx_path(const char *name)
{
    static char buf[4][1024];
    static int k;
    const char *dir = getenv("EMBER_TEST_DATA");
    if (!dir) fail_msg("EMBER_TEST_DATA is not set");
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* ---- a STORED zip writer and pickle bytes ------------------------------------------ */

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t k)
{
    if (b->n + k > b->cap) {
        b->cap = (b->n + k) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, k);
    b->n += k;
}
static void put8(buf *b, unsigned v) { uint8_t c = (uint8_t)v; put(b, &c, 1); }
static void put16(buf *b, unsigned v) { put8(b, v & 0xFF), put8(b, (v >> 8) & 0xFF); }
static void put32(buf *b, uint32_t v) { put16(b, v & 0xFFFF), put16(b, v >> 16); }
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

typedef struct zfile {
    const char *name;
    const uint8_t *data;
    size_t n;
} zfile;

static void put64(buf *b, uint64_t v) { put32(b, (uint32_t)v), put32(b, (uint32_t)(v >> 32)); }

/* A zip of STORED records, as torch's writer makes (without its alignment
 * padding); with @p zip64 every size and offset goes through the ZIP64
 * extra field and end records, as a writer does past 4 GiB. */
static buf make_zip64(const zfile *fs, int nf, bool zip64)
{
    buf z = {0}, cd = {0};
    for (int i = 0; i < nf; i++) {
        uint32_t off = (uint32_t)z.n, crc = crc32_of(fs[i].data, fs[i].n);
        size_t nl = strlen(fs[i].name);
        put32(&z, 0x04034b50), put16(&z, 20), put16(&z, 0), put16(&z, 0), put16(&z, 0), put16(&z, 0);
        put32(&z, crc), put32(&z, (uint32_t)fs[i].n), put32(&z, (uint32_t)fs[i].n), put16(&z, (unsigned)nl), put16(&z, 0);
        puts_(&z, fs[i].name);
        if (fs[i].n) put(&z, fs[i].data, fs[i].n);
        uint32_t big = 0xFFFFFFFFu;
        put32(&cd, 0x02014b50), put16(&cd, 45), put16(&cd, 45), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0);
        put32(&cd, crc), put32(&cd, zip64 ? big : (uint32_t)fs[i].n), put32(&cd, zip64 ? big : (uint32_t)fs[i].n);
        put16(&cd, (unsigned)nl), put16(&cd, zip64 ? 28 : 0), put16(&cd, 0), put16(&cd, 0), put16(&cd, 0), put32(&cd, 0);
        put32(&cd, zip64 ? big : off);
        puts_(&cd, fs[i].name);
        if (zip64) put16(&cd, 1), put16(&cd, 24), put64(&cd, fs[i].n), put64(&cd, fs[i].n), put64(&cd, off);
    }
    uint64_t cdoff = z.n;
    put(&z, cd.p, cd.n);
    if (zip64) {
        uint64_t z64 = z.n;
        put32(&z, 0x06064b50), put64(&z, 44), put16(&z, 45), put16(&z, 45), put32(&z, 0), put32(&z, 0);
        put64(&z, (uint64_t)nf), put64(&z, (uint64_t)nf), put64(&z, cd.n), put64(&z, cdoff);
        put32(&z, 0x07064b50), put32(&z, 0), put64(&z, z64), put32(&z, 1);
        put32(&z, 0x06054b50), put16(&z, 0), put16(&z, 0), put16(&z, 0xFFFF), put16(&z, 0xFFFF);
        put32(&z, 0xFFFFFFFFu), put32(&z, 0xFFFFFFFFu), put16(&z, 0);
    } else {
        put32(&z, 0x06054b50), put16(&z, 0), put16(&z, 0), put16(&z, (unsigned)nf), put16(&z, (unsigned)nf);
        put32(&z, (uint32_t)cd.n), put32(&z, (uint32_t)cdoff), put16(&z, 0);
    }
    free(cd.p);
    return z;
}
static buf make_zip(const zfile *fs, int nf) { return make_zip64(fs, nf, false); }

/* Opens a pickle (and optional storage record "0") wrapped in an archive. */
static em_pt_file *open_pickle(const buf *pk, const void *storage, size_t ns)
{
    zfile fs[2] = {{"archive/data.pkl", pk->p, pk->n}, {"archive/data/0", storage, ns}};
    buf z = make_zip(fs, storage ? 2 : 1);
    em_pt_file *f = em_pt_open_memory(z.p, z.n, "evil.pt");
    free(z.p);
    return f;
}

static void pk_str(buf *b, const char *s)
{
    put8(b, 'X');
    put32(b, (uint32_t)strlen(s));
    puts_(b, s);
}
static void pk_long(buf *b, int64_t v) /* LONG1 of 8 bytes */
{
    put8(b, 0x8a), put8(b, 8);
    for (int i = 0; i < 8; i++) put8(b, (unsigned)(((uint64_t)v >> (8 * i)) & 0xFF));
}

/* {"w": tensor} with storage ('storage', FloatStorage, '0', 'cpu', numel), the
 * given offset, sizes and strides (torch's bytes for a state_dict entry). */
static void pk_tensor(buf *b, int64_t numel, int64_t offset, int nd, const int64_t *size, const int64_t *stride);
static buf pk_tensor_dict(int64_t numel, int64_t offset, int nd, const int64_t *size, const int64_t *stride)
{
    buf b = {0};
    put8(&b, 0x80), put8(&b, 2), put8(&b, '}');
    pk_str(&b, "w");
    pk_tensor(&b, numel, offset, nd, size, stride);
    put8(&b, 's'), put8(&b, '.');
    return b;
}

/* The bytes of one _rebuild_tensor_v2(...) value. */
static void pk_tensor(buf *bp, int64_t numel, int64_t offset, int nd, const int64_t *size, const int64_t *stride)
{
    buf b = *bp;
    puts_(&b, "ctorch._utils\n_rebuild_tensor_v2\n");
    put8(&b, '('), put8(&b, '(');
    pk_str(&b, "storage");
    puts_(&b, "ctorch\nFloatStorage\n");
    pk_str(&b, "0"), pk_str(&b, "cpu"), pk_long(&b, numel);
    put8(&b, 't'), put8(&b, 'Q');
    pk_long(&b, offset);
    put8(&b, '(');
    for (int d = 0; d < nd; d++) pk_long(&b, size[d]);
    put8(&b, 't'), put8(&b, '(');
    for (int d = 0; d < nd; d++) pk_long(&b, stride[d]);
    put8(&b, 't'), put8(&b, 0x89);
    puts_(&b, "ccollections\nOrderedDict\n)R");
    put8(&b, 't'), put8(&b, 'R');
    *bp = b;
}

static const float STORE4[4] = {1, 2, 3, 4};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the MLP of the fixture ----------------------------------------------------------- */

static em_tensor *mlp_forward(em_module *m, const em_tensor *x)
{
    em_scope_begin();
    em_tensor *h = em_relu(em_module_forward(em_module_get_child(m, "fc1"), x));
    em_tensor *y = em_keep(em_module_forward(em_module_get_child(m, "fc2"), h));
    em_scope_end();
    return y;
}
static const em_module_vtable MLP_VT = {"MLP", mlp_forward, NULL};

static em_module *mlp_new(void)
{
    em_module *m = em_module_new(&MLP_VT, NULL);
    assert_non_null(m);
    assert_int_equal(em_module_add_child(m, "fc1", em_linear_new(4, 8, true)), EM_OK);
    assert_int_equal(em_module_add_child(m, "fc2", em_linear_new(8, 3, true)), EM_OK);
    return m;
}

/* max |forward(x) - y_torch| */
static double mlp_error(em_module *m, const em_st_file *ex)
{
    em_scope_begin();
    em_tensor *x = em_safetensors_tensor(ex, "mlp/x"), *want = em_safetensors_tensor(ex, "mlp/y");
    assert_non_null(x);
    assert_non_null(want);
    em_tensor *y = em_module_forward(m, x);
    assert_non_null(y);
    int64_t sh[2] = {5, 3};
    em_test_assert_shape(y, 2, sh);
    double *a = em_test_values(y), *b = em_test_values(want), err = 0;
    for (int i = 0; i < 15; i++) err = fabs(a[i] - b[i]) > err ? fabs(a[i] - b[i]) : err;
    free(a);
    free(b);
    em_scope_end();
    return err;
}

/* .pt import reproduces PyTorch's outputs */
static void test_mlp_outputs(void **state)
{
    (void)state;
    em_st_file *ex = em_safetensors_open(fx_path("pt_expect.safetensors"));
    assert_non_null(ex);
    static const char *files[] = {"pt_mlp.pt", "pt_mlp_proto4.pt", "pt_mlp_deflate.pt"};
    for (int k = 0; k < 3; k++) {
        em_pt_file *f = em_pt_open(fx_path(files[k]));
        if (!f) fail_msg("%s: %s", files[k], em_last_error());
        assert_int_equal(em_pt_count(f), 4);
        static const char *order[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
        for (int i = 0; i < 4; i++) assert_string_equal(em_pt_name(f, (size_t)i), order[i]);
        assert_null(em_pt_name(f, 4));
        em_module *m = mlp_new();
        assert_int_equal(em_pt_load_from(m, f, NULL, 0, true), EM_OK);
        double err = mlp_error(m, ex);
        printf("%s: .pt import reproduces PyTorch's outputs: max |y - y_torch| = %.3g\n", files[k], err);
        assert_true(err <= 1e-6);
        em_module_free(m);
        em_pt_close(f);
    }
    /* the same weights into an nn.Sequential ("0.weight", "2.weight"): remapped by regex */
    em_module *seq = em_sequential_new((em_module *[]){em_linear_new(4, 8, true), em_relu_new(), em_linear_new(8, 3, true)}, 3);
    const char *rules[] = {"^fc1\\.=0.", "^fc([0-9])\\.(.*)=\\1.\\2", "^3\\.=2."};
    assert_int_equal(em_pt_load_into(seq, fx_path("pt_mlp.pt"), rules, 3, true), EM_OK);
    assert_true(mlp_error(seq, ex) <= 1e-6);
    em_module_free(seq);
    em_safetensors_close(ex);
}

/* A CNN with BatchNorm: its buffers (running statistics, num_batches_tracked) load too. */
static void test_cnn_outputs(void **state)
{
    (void)state;
    em_st_file *ex = em_safetensors_open(fx_path("pt_expect.safetensors"));
    assert_non_null(ex);
    em_conv_opts co = em_conv_opts_default();
    co.padding[0] = co.padding[1] = 1;
    em_module *mods[5] = {em_conv2d_new(1, 4, 3, 3, &co, false), em_batch_norm2d_new(4, 1e-5, 0.1, true, true),
                          em_relu_new(), em_flatten_new(1, -1), em_linear_new(100, 3, true)};
    em_module *net = em_sequential_new(mods, 5);
    assert_non_null(net);
    if (em_pt_load_into(net, fx_path("pt_cnn.pt"), NULL, 0, true) != EM_OK) fail_msg("%s", em_last_error());
    em_module_train(net, false);
    em_scope_begin();
    em_tensor *x = em_safetensors_tensor(ex, "cnn/x"), *want = em_safetensors_tensor(ex, "cnn/y");
    em_tensor *y = em_module_forward(net, x);
    assert_non_null(y);
    double *a = em_test_values(y), *b = em_test_values(want), err = 0;
    for (int i = 0; i < 6; i++) err = fabs(a[i] - b[i]) > err ? fabs(a[i] - b[i]) : err;
    printf("pt_cnn.pt: .pt import reproduces PyTorch's eval outputs: max |y - y_torch| = %.3g\n", err);
    assert_true(err <= 1e-5);
    int64_t nbt = 0;
    assert_int_equal(em_to_host(em_module_get_buffer(net, "1.num_batches_tracked"), &nbt, sizeof nbt), EM_OK);
    assert_int_equal(nbt, 3);
    free(a);
    free(b);
    em_scope_end();
    em_module_free(net);
    em_safetensors_close(ex);
}

/* Every tensor of every fixture, bit for bit, against pt_expect.safetensors. */
static void test_exact_bits(void **state)
{
    (void)state;
    em_st_file *ex = em_safetensors_open(fx_path("pt_expect.safetensors"));
    assert_non_null(ex);
    static const char *pref[][2] = {{"mlp/", "pt_mlp.pt"}, {"dtypes/", "pt_dtypes.pt"}, {"views/", "pt_views.pt"},
                                   {"nested/", "pt_nested.pt"}};
    for (int k = 0; k < 4; k++) {
        em_pt_file *f = em_pt_open(fx_path(pref[k][1]));
        if (!f) fail_msg("%s: %s", pref[k][1], em_last_error());
        size_t pl = strlen(pref[k][0]), seen = 0;
        for (size_t i = 0; i < em_safetensors_count(ex); i++) {
            const em_st_tensor *w = em_safetensors_at(ex, i);
            if (strncmp(w->name, pref[k][0], pl) || !strcmp(w->name, "mlp/x") || !strcmp(w->name, "mlp/y")) continue;
            const em_pt_entry *e = em_pt_find(f, w->name + pl);
            if (!e) fail_msg("%s: %s", pref[k][1], em_last_error());
            seen++;
            assert_int_equal(e->dtype, w->dtype);
            assert_int_equal(e->ndim, w->ndim);
            for (int d = 0; d < e->ndim; d++) assert_int_equal(e->shape[d], w->shape[d]);
            assert_int_equal(e->nbytes, w->nbytes);
            if (w->nbytes && memcmp(e->data, w->data, w->nbytes))
                fail_msg("%s: '%s' differs from torch's values", pref[k][1], e->name);
            /* as an Ember tensor: the same bits */
            size_t idx = (size_t)(e - em_pt_at(f, 0));
            em_tensor *t = em_pt_tensor(f, idx);
            assert_non_null(t);
            assert_int_equal(em_tensor_dtype(t), w->dtype);
            uint8_t *back = malloc(w->nbytes + 1);
            assert_int_equal(em_to_host(t, back, w->nbytes), EM_OK);
            assert_memory_equal(back, w->data, w->nbytes);
            free(back);
            em_tensor_release(t);
        }
        printf("%s: %zu tensors, all bit-exact\n", pref[k][1], seen);
        assert_int_equal(seen, em_pt_count(f)); /* nothing more in the .pt than torch's flattening */
        em_pt_close(f);
    }
    em_safetensors_close(ex);
}

static void test_views_layout(void **state)
{
    (void)state;
    em_pt_file *f = em_pt_open(fx_path("pt_views.pt"));
    assert_non_null(f);
    const em_pt_entry *t = em_pt_find(f, "transposed"), *s = em_pt_find(f, "sliced"), *x = em_pt_find(f, "expanded");
    assert_int_equal(t->stride[0], 1);
    assert_int_equal(t->stride[1], 6);
    assert_int_equal(s->storage_offset, 7);
    assert_int_equal(s->stride[1], 2);
    assert_int_equal(x->stride[1], 0);
    const float *xv = x->data;
    assert_true(xv[4] == 1.0f && xv[7] == 1.0f && xv[11] == 2.0f);
    assert_string_equal(em_pt_find(f, "shared_a")->storage_key, em_pt_find(f, "shared_b")->storage_key);
    assert_string_equal(em_pt_find(f, "tied_1")->storage_key, em_pt_find(f, "tied_2")->storage_key);
    assert_int_equal(em_pt_find(f, "scalar")->ndim, 0);
    assert_int_equal(em_pt_find(f, "scalar")->numel, 1);
    assert_int_equal(em_pt_find(f, "empty")->numel, 0);
    assert_string_equal(em_pt_find(f, "param")->storage_type, "FloatStorage");
    assert_null(em_pt_find(f, "nope"));
    assert_msg_has("no tensor 'nope'");
    em_pt_close(f);
}

static void test_nested_checkpoint(void **state)
{
    (void)state;
    em_pt_file *f = em_pt_open(fx_path("pt_nested.pt"));
    assert_non_null(f);
    assert_non_null(em_pt_find(f, "model.fc1.weight"));
    assert_non_null(em_pt_find(f, "optim.state.0.exp_avg"));
    assert_non_null(em_pt_find(f, "optim.state.3.step"));
    assert_null(em_pt_find(f, "epoch")); /* ints, strings, floats, None: skipped */
    em_module *m = mlp_new();
    const char *strip[] = {"^model\\.="};
    /* strict: the optimizer's tensors are unexpected */
    assert_int_equal(em_pt_load_from(m, f, strip, 1, true), EM_ERR_FORMAT);
    assert_msg_has("unexpected keys in the file (not in the model, after remapping)");
    assert_msg_has("'optim.state.0.step'");
    /* not strict: the model's keys load */
    assert_int_equal(em_pt_load_from(m, f, strip, 1, false), EM_OK);
    const em_pt_entry *w = em_pt_find(f, "model.fc2.bias");
    float got[3];
    assert_int_equal(em_to_host(em_module_get_param(m, "fc2.bias"), got, sizeof got), EM_OK);
    assert_memory_equal(got, w->data, sizeof got);
    em_module_free(m);
    em_pt_close(f);
}

static void test_load_errors(void **state)
{
    (void)state;
    const char *mlp = fx_path("pt_mlp.pt");
    em_module *m = mlp_new();
    float before[3];
    assert_int_equal(em_to_host(em_module_get_param(m, "fc2.bias"), before, sizeof before), EM_OK);
    /* missing (no rules match fc2 after renaming) and unexpected */
    const char *ren[] = {"^fc2=head"};
    assert_int_equal(em_pt_load_into(m, mlp, ren, 1, true), EM_ERR_FORMAT);
    assert_msg_has("pt_mlp.pt: 2 keys missing from the file: 'fc2.weight', 'fc2.bias'");
    assert_msg_has("2 unexpected keys in the file (not in the model, after remapping): 'head.weight', 'head.bias'");
    /* a shape mismatch names the key and both shapes; nothing written */
    em_module *wrong = em_module_new(&MLP_VT, NULL);
    assert_int_equal(em_module_add_child(wrong, "fc1", em_linear_new(4, 8, true)), EM_OK);
    assert_int_equal(em_module_add_child(wrong, "fc2", em_linear_new(8, 2, true)), EM_OK);
    assert_int_equal(em_pt_load_into(wrong, mlp, NULL, 0, true), EM_ERR_SHAPE);
    assert_msg_has("key 'fc2.weight': shape [3, 8] in file, [2, 8] in model");
    em_module_free(wrong);
    em_module *head = em_module_new(&MLP_VT, NULL);
    assert_int_equal(em_module_add_child(head, "head", em_linear_new(8, 2, true)), EM_OK);
    assert_int_equal(em_pt_load_into(head, mlp, (const char *[]){"^fc2=head"}, 1, false), EM_ERR_SHAPE);
    assert_msg_has("key 'head.weight' (file key 'fc2.weight'): shape [3, 8] in file, [2, 8] in model");
    em_module_free(head);
    /* dtype */
    em_module *dm = em_module_new(&MLP_VT, NULL);
    em_tensor *b64 = em_zeros((int64_t[]){3}, 1, EM_F64);
    assert_int_equal(em_module_add_param(dm, "bias", b64), EM_OK);
    em_tensor_release(b64);
    assert_int_equal(em_pt_load_into(dm, mlp, (const char *[]){"^fc2\\.=", "^fc1(.*)=skip\\1"}, 2, false), EM_ERR_DTYPE);
    assert_msg_has("key 'bias' (file key 'fc2.bias'): dtype float32 in file, float64 in model");
    em_module_free(dm);
    /* two file keys onto one */
    assert_int_equal(em_pt_load_into(m, mlp, (const char *[]){"^fc[12]\\.=x."}, 1, false), EM_ERR_INVALID);
    assert_msg_has("file keys 'fc1.bias' and 'fc2.bias' both remap to 'x.bias'");
    /* bad rules */
    assert_int_equal(em_pt_load_into(m, mlp, (const char *[]){"noequals"}, 1, true), EM_ERR_INVALID);
    assert_msg_has("key rule 1 'noequals' is not PATTERN=REPLACEMENT");
    assert_int_equal(em_pt_load_into(m, mlp, (const char *[]){"a(=b"}, 1, true), EM_ERR_INVALID);
    assert_msg_has("bad regex 'a('");
    assert_int_equal(em_pt_load_into(m, mlp, (const char *[]){"(a)=\\2"}, 1, true), EM_ERR_INVALID);
    assert_msg_has("\\2 but the pattern has 1 group");
    float after[3];
    assert_int_equal(em_to_host(em_module_get_param(m, "fc2.bias"), after, sizeof after), EM_OK);
    assert_memory_equal(before, after, sizeof after); /* every failure left the module as it was */
    assert_int_equal(em_pt_load_into(m, fx_path("nonexistent.pt"), NULL, 0, true), EM_ERR_IO);
    assert_msg_has("nonexistent.pt: cannot open");
    em_module_free(m);
}

static void test_remap_key(void **state)
{
    (void)state;
    char out[64];
    const char *r1[] = {"^model\\.=", "^fc([0-9])\\.(.*)=layers.\\1.\\2"};
    assert_int_equal(em_pt_remap_key(r1, 2, "model.fc1.weight", out, sizeof out), EM_OK);
    assert_string_equal(out, "layers.1.weight");
    const char *r2[] = {"\\.=/"}; /* every match, as re.sub */
    assert_int_equal(em_pt_remap_key(r2, 1, "a.b.c", out, sizeof out), EM_OK);
    assert_string_equal(out, "a/b/c");
    const char *r3[] = {"x*=-"}; /* empty matches advance */
    assert_int_equal(em_pt_remap_key(r3, 1, "ab", out, sizeof out), EM_OK);
    assert_string_equal(out, "-a-b-");
    const char *r4[] = {"[=]=eq", "(b)=<\\0\\\\\\1>"};
    assert_int_equal(em_pt_remap_key(r4, 2, "a=b", out, sizeof out), EM_OK);
    assert_string_equal(out, "aeq<b\\b>");
    assert_int_equal(em_pt_remap_key(NULL, 0, "same", out, sizeof out), EM_OK);
    assert_string_equal(out, "same");
    assert_int_equal(em_pt_remap_key(r1, 2, "model.fc1.weight", out, 4), EM_ERR_INVALID);
    assert_msg_has("above the 4-byte buffer");
}

static void test_legacy_and_not_zip(void **state)
{
    (void)state;
    assert_null(em_pt_open(fx_path("pt_legacy.pt")));
    assert_int_equal(em_last_status(), EM_ERR_UNSUPPORTED);
    assert_msg_has("pt_legacy.pt: legacy (pre-1.6) torch.save format is not supported; re-save with torch>=1.6");
    /* torch.save(model): the module's class is a global outside the set */
    assert_null(em_pt_open(fx_path("pt_module.pt")));
    assert_msg_has("GLOBAL 'torch.nn.modules.linear.Linear' is not allowed");
    assert_msg_has("save model.state_dict() instead");
    assert_null(em_pt_open_memory("hello world, no zip", 19, "junk.pt"));
    assert_msg_has("junk.pt: not a zip archive");
    assert_null(em_pt_open_memory("", 0, NULL));
    assert_msg_has("<memory>: not a zip archive");
    /* a zip without data.pkl */
    zfile fs[1] = {{"archive/other.txt", (const uint8_t *)"x", 1}};
    buf z = make_zip(fs, 1);
    assert_null(em_pt_open_memory(z.p, z.n, "plain.zip"));
    assert_msg_has("plain.zip: no '<folder>/data.pkl' record");
    free(z.p);
    /* TorchScript */
    zfile ts[2] = {{"m/data.pkl", (const uint8_t *)"\x80\x02}.", 4}, {"m/constants.pkl", (const uint8_t *)"\x80\x02).", 4}};
    z = make_zip(ts, 2);
    assert_null(em_pt_open_memory(z.p, z.n, "script.pt"));
    assert_msg_has("TorchScript archive (torch.jit.save) is not supported");
    free(z.p);
    /* a directory */
    assert_null(em_pt_open(getenv("EMBER_TEST_DATA")));
    assert_msg_has("not a regular file");
}

/* ---- malicious and damaged files --------------------------------------------------------- */

static void expect_evil(const char *pickle, size_t n, const char *msg1, const char *msg2)
{
    buf b = {0};
    put(&b, pickle, n);
    em_pt_file *f = open_pickle(&b, NULL, 0);
    if (f) fail_msg("a malicious pickle was accepted (expected \"%s\")", msg1);
    assert_int_equal(em_last_status() == EM_ERR_FORMAT || em_last_status() == EM_ERR_UNSUPPORTED, 1);
    assert_msg_has("evil.pt: data.pkl byte ");
    assert_msg_has(msg1);
    if (msg2) assert_msg_has(msg2);
    free(b.p);
}
#define EVIL(lit, m1, m2) expect_evil(lit, sizeof(lit) - 1, m1, m2)

static void test_malicious_pickles(void **state)
{
    (void)state;
    /* os.system('touch /tmp/pwned') through GLOBAL + REDUCE: refused at the GLOBAL */
    EVIL("\x80\x02" "cos\nsystem\n" "X\x10\x00\x00\x00touch /tmp/pwned" "\x85R.", "byte 2: GLOBAL 'os.system' is not allowed",
         "nothing is executed");
    EVIL("\x80\x02" "cposix\nsystem\n", "GLOBAL 'posix.system' is not allowed", NULL);
    /* builtins.eval through protocol 4's STACK_GLOBAL */
    EVIL("\x80\x04\x95\x20\x00\x00\x00\x00\x00\x00\x00" "\x8c\x08" "builtins\x94" "\x8c\x04" "eval\x94\x93",
         "STACK_GLOBAL 'builtins.eval' is not allowed", NULL);
    EVIL("\x80\x02" "c__builtin__\neval\n", "byte 2: GLOBAL '__builtin__.eval' is not allowed", NULL);
    EVIL("\x80\x02" "ctorch\nload\n", "GLOBAL 'torch.load' is not allowed", NULL);
    /* a known class called the wrong way */
    EVIL("\x80\x02" "ctorch\nFloatStorage\n)R.", "byte 23: REDUCE of torch.FloatStorage is not allowed", NULL);
    EVIL("\x80\x02" "ccollections\nOrderedDict\n" "K\x01\x85R.", "OrderedDict called with 1 arguments", NULL);
    EVIL("\x80\x02" "ctorch\nComplexFloatStorage\n", "storage dtype not supported", NULL);
    /* opcodes outside the subset: INST, OBJ, NEWOBJ, EXT1, unknown */
    EVIL("\x80\x02" "ios\nsystem\n", "byte 2: opcode 0x69 'i' is not allowed", NULL);
    EVIL("\x80\x02(o.", "opcode 0x6f 'o' is not allowed", NULL);
    EVIL("\x80\x02" "\x81", "opcode 0x81 is not allowed", NULL);
    EVIL("\x80\x02" "\x82\x01", "opcode 0x82 is not allowed", NULL);
    EVIL("\x80\x02}\xff", "byte 3: opcode 0xff is not allowed", NULL);
    EVIL("\x80\x09}.", "pickle protocol 9", NULL);
    /* stack / memo abuse */
    EVIL("\x80\x02R", "REDUCE with fewer than 2 stack entries", NULL);
    EVIL("\x80\x02}(R", "REDUCE with fewer than 2 stack entries", NULL); /* not below the MARK */
    EVIL("\x80\x02h\x05", "memo entry 5 read before it was stored", NULL);
    EVIL("\x80\x02}r\xff\xff\xff\x7f", "memo index 2147483647 out of range", NULL);
    EVIL("\x80\x02t", "no MARK on the stack", NULL);
    EVIL("\x80\x02" "K\x01K\x02s", "SETITEM with 2 stack entries", NULL);
    EVIL("\x80\x02]K\x01K\x02s", "SETITEM on a list, not a dict", NULL);
    EVIL("\x80\x02" "K\x01Q", "BINPERSID of something other than", NULL);
    EVIL("\x80\x02" "}K\x01" "b", "BUILD of a dict with a int state", NULL);
    EVIL("\x80\x02" "X\xff\xff\xff\x7f" "abc", "a 2147483647-byte string past the end", NULL);
    EVIL("\x80\x02" "X\x03\x00\x00\x00" "a\x00" "b", "string with a NUL character", NULL);
    EVIL("\x80\x02" "\x8a\x09" "123456789", "LONG1 of 9 bytes", NULL);
    EVIL("\x80\x02}", "truncated (no STOP opcode)", NULL);
    EVIL("\x80\x02.", "STOP with an empty stack", NULL);
    /* deep MARK nesting */
    {
        char deep[2 + 10000];
        deep[0] = (char)0x80, deep[1] = 2;
        memset(deep + 2, '(', 10000);
        expect_evil(deep, sizeof deep, "byte 258: MARK nested deeper than 256 levels", NULL);
    }
    /* a dict that holds itself: flattening stops at the depth limit */
    buf b = {0};
    put(&b, "\x80\x02}q\x00", 5);
    pk_str(&b, "a");
    put(&b, "h\x00s.", 4);
    assert_null(open_pickle(&b, NULL, 0));
    assert_msg_has("containers nested deeper than 64 levels (or a cycle) at 'a.a.a.a");
    free(b.p);
    /* a billion laughs: list i holds list i-1 twice (memo), 2^40 paths to walk */
    b = (buf){0};
    put(&b, "\x80\x02}]q\x00" "0", 7);
    for (int i = 1; i <= 40; i++) {
        uint8_t l[] = {']', '(', 'h', (uint8_t)(i - 1), 'h', (uint8_t)(i - 1), 'e', 'q', (uint8_t)i, '0'};
        put(&b, l, sizeof l);
    }
    pk_str(&b, "a");
    put(&b, "h\x28s.", 4);
    assert_null(open_pickle(&b, NULL, 0));
    assert_msg_has("container items reached (containers shared through the memo): not a state_dict");
    free(b.p);
    /* top level not a dict */
    b = (buf){0};
    puts_(&b, "\x80\x02]K\x01" "a.");
    assert_null(open_pickle(&b, NULL, 0));
    assert_msg_has("evil.pt: data.pkl holds a list, not a dict");
    free(b.p);
}

static void test_bad_tensors(void **state)
{
    (void)state;
    /* the valid baseline */
    buf b = pk_tensor_dict(4, 0, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2});
    em_pt_file *f = open_pickle(&b, STORE4, sizeof STORE4);
    if (!f) fail_msg("%s", em_last_error());
    const float *v = em_pt_find(f, "w")->data;
    assert_true(v[0] == 1 && v[1] == 3 && v[2] == 2 && v[3] == 4); /* transposed through its strides */
    em_pt_close(f);
    free(b.p);
    struct {
        int64_t numel, off;
        int nd;
        int64_t size[3], stride[3];
        const char *msg;
    } cases[] = {
        {4, 100, 1, {1}, {1}, "size [1] at storage offset 100 reaches element 100 of a 4-element storage"},
        {4, 2, 1, {3}, {1}, "reaches element 4 of a 4-element storage"},
        {4, 0, 2, {2, 2}, {1, 3}, "reaches element 4"},
        {4, 7, 1, {0}, {1}, "storage offset 7 past the 4-element storage"},
        {4, -1, 1, {1}, {1}, "negative storage offset -1"},
        {4, 0, 1, {-2}, {1}, "negative size or stride"},
        {4, 0, 2, {2, 2}, {-1, 1}, "negative size or stride"},
        {4, 0, 3, {INT64_C(1) << 40, INT64_C(1) << 40, INT64_C(1) << 40}, {0, 0, 0}, "overflows"},
        {4, 0, 2, {INT64_C(1) << 62, 2}, {0, 0}, "overflows"},
        {4, 0, 2, {3, 2}, {INT64_C(1) << 62, 1}, "strides overflow"},
        {4, 0, 1, {INT64_C(1) << 40}, {0}, "above the limit"},
        {5, 0, 1, {1}, {1}, "storage record 'archive/data/0' holds 16 bytes, its 5 elements of FloatStorage need 20"},
        {INT64_MAX, 0, 1, {1}, {1}, "storage of 9223372036854775807 elements overflows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        b = pk_tensor_dict(cases[i].numel, cases[i].off, cases[i].nd, cases[i].size, cases[i].stride);
        assert_null(open_pickle(&b, STORE4, sizeof STORE4));
        assert_msg_has("evil.pt: tensor 'w'");
        assert_msg_has(cases[i].msg);
        free(b.p);
    }
    /* no storage record */
    b = pk_tensor_dict(4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    assert_null(open_pickle(&b, NULL, 0));
    assert_msg_has("storage record 'archive/data/0' is missing from the archive");
    free(b.p);
}

/* Every prefix of a real file, and of a valid pickle inside a valid zip: an error each time. */
static void test_truncated(void **state)
{
    (void)state;
    size_t n;
    uint8_t *d = slurp(fx_path("pt_mlp.pt"), &n);
    em_pt_file *whole = em_pt_open_memory(d, n, "mlp");
    assert_non_null(whole);
    em_pt_close(whole);
    for (size_t k = 0; k < n; k++) {
        uint8_t *c = malloc(k + 1); /* exactly k bytes readable (ASan / valgrind see overreads) */
        memcpy(c, d, k);
        em_pt_file *f = em_pt_open_memory(c, k, "cut.pt");
        if (f) fail_msg("a %zu-byte prefix of a %zu-byte file was accepted", k, n);
        assert_true(strstr(em_last_error(), "cut.pt: ") == em_last_error());
        free(c);
    }
    /* a byte changed in a record: the CRC */
    d[n / 2] ^= 0x55;
    em_pt_file *f = em_pt_open_memory(d, n, "flip.pt");
    if (f) em_pt_close(f); /* a byte of zip padding may not matter */
    else assert_true(strstr(em_last_error(), "flip.pt") != NULL);
    free(d);
    buf b = pk_tensor_dict(4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    for (size_t k = 0; k < b.n; k++) {
        buf cut = {0};
        put(&cut, b.p, k);
        em_pt_file *g = open_pickle(&cut, STORE4, sizeof STORE4);
        if (g) fail_msg("a %zu-byte prefix of a %zu-byte pickle was accepted", k, b.n);
        assert_msg_has("evil.pt: ");
        free(cut.p);
    }
    free(b.p);
}

static void test_crc(void **state)
{
    (void)state;
    buf b = pk_tensor_dict(4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    zfile fs[2] = {{"archive/data.pkl", b.p, b.n}, {"archive/data/0", (const uint8_t *)STORE4, sizeof STORE4}};
    buf z = make_zip(fs, 2);
    /* the last byte of the storage record sits just before the central directory */
    size_t at = 0;
    for (size_t i = 0; i + 4 <= z.n; i++)
        if (!memcmp(z.p + i, "\x50\x4b\x01\x02", 4)) {
            at = i - 1;
            break;
        }
    z.p[at] ^= 1;
    assert_null(em_pt_open_memory(z.p, z.n, "crc.pt"));
    assert_msg_has("crc.pt: record 'archive/data/0': CRC-32 mismatch");
    free(z.p);
    free(b.p);
}

/* Many tensors in one storage: open and load stay fast (no quadratic lookups). */
static void test_many_and_duplicates(void **state)
{
    (void)state;
    enum { N = 20000 };
    buf b = {0};
    puts_(&b, "\x80\x02}(");
    for (int i = 0; i < N; i++) {
        char k[32];
        snprintf(k, sizeof k, "layer.%d.w", i);
        pk_str(&b, k);
        pk_tensor(&b, 4, i % 4, 1, (int64_t[]){1}, (int64_t[]){1});
    }
    puts_(&b, "u.");
    double t0 = now_s();
    em_pt_file *f = open_pickle(&b, STORE4, sizeof STORE4);
    if (!f) fail_msg("%s", em_last_error());
    assert_int_equal(em_pt_count(f), N);
    assert_true(*(const float *)em_pt_find(f, "layer.19999.w")->data == 4.0f);
    double t1 = now_s();
    char rule_out[64];
    assert_int_equal(em_pt_remap_key((const char *[]){"^layer\\.=l"}, 1, "layer.5.w", rule_out, sizeof rule_out), EM_OK);
    printf("%d tensors: opened in %.3f s\n", N, t1 - t0);
    assert_true(t1 - t0 < 60.0); /* 0.4 s natively, 5.6 s under valgrind */
    em_pt_close(f);
    free(b.p);
    /* {"a.b": t, "a": {"b": t}}: one flattened key twice */
    b = (buf){0};
    puts_(&b, "\x80\x02}(");
    pk_str(&b, "a.b");
    pk_tensor(&b, 4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    pk_str(&b, "a");
    puts_(&b, "}");
    pk_str(&b, "b");
    pk_tensor(&b, 4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    puts_(&b, "su.");
    assert_null(open_pickle(&b, STORE4, sizeof STORE4));
    assert_msg_has("evil.pt: two tensors with the flattened key 'a.b'");
    /* a record name twice in the zip; a big-endian writer */
    zfile two[3] = {{"archive/data.pkl", b.p, b.n}, {"archive/data/0", (const uint8_t *)STORE4, 16}, {"archive/data/0", (const uint8_t *)STORE4, 16}};
    buf z = make_zip(two, 3);
    assert_null(em_pt_open_memory(z.p, z.n, "dup.pt"));
    assert_msg_has("dup.pt: the zip archive holds two records named 'archive/data/0'");
    free(z.p);
    zfile big[2] = {{"archive/data.pkl", b.p, b.n}, {"archive/byteorder", (const uint8_t *)"big", 3}};
    z = make_zip(big, 2);
    assert_null(em_pt_open_memory(z.p, z.n, "big.pt"));
    assert_msg_has("big.pt: written on a big-endian machine");
    free(z.p);
    free(b.p);
}

static void test_zip64(void **state)
{
    (void)state;
    buf b = pk_tensor_dict(4, 0, 2, (int64_t[]){2, 2}, (int64_t[]){2, 1});
    zfile fs[2] = {{"archive/data.pkl", b.p, b.n}, {"archive/data/0", (const uint8_t *)STORE4, sizeof STORE4}};
    buf z = make_zip64(fs, 2, true);
    em_pt_file *f = em_pt_open_memory(z.p, z.n, "zip64.pt");
    if (!f) fail_msg("%s", em_last_error());
    assert_memory_equal(em_pt_find(f, "w")->data, STORE4, sizeof STORE4);
    em_pt_close(f);
    /* the locator pointing nowhere */
    size_t loc = z.n - 22 - 20;
    z.p[loc + 8] ^= 0x40;
    assert_null(em_pt_open_memory(z.p, z.n, "zip64.pt"));
    assert_msg_has("zip64.pt: bad ZIP64 end-of-central-directory record");
    free(z.p);
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_outputs),       cmocka_unit_test(test_cnn_outputs),
        cmocka_unit_test(test_exact_bits),
        cmocka_unit_test(test_views_layout),      cmocka_unit_test(test_nested_checkpoint),
        cmocka_unit_test(test_load_errors),       cmocka_unit_test(test_remap_key),
        cmocka_unit_test(test_legacy_and_not_zip), cmocka_unit_test(test_malicious_pickles),
        cmocka_unit_test(test_bad_tensors),       cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_crc),               cmocka_unit_test(test_many_and_duplicates),
        cmocka_unit_test(test_zip64),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
