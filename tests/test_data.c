/* Tests of data/: IDX reader, MNIST / CSV datasets, DataLoader. */
#define _GNU_SOURCE
#include "testutil.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static void write_bytes(const char *path, bool gz, const void *data, size_t n)
{
    if (gz) {
        /* the gzip program (Debian: essential), so the test needs no zlib */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "gzip -n -c > '%s'", path);
        FILE *f = popen(cmd, "w");
        assert_non_null(f);
        if (n) assert_int_equal(fwrite(data, 1, n, f), n);
        assert_int_equal(pclose(f), 0);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (n) assert_int_equal(fwrite(data, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
    }
}

/* Writes an IDX file: magic, dims (big-endian), then `payload` (payload_n
 * bytes, already big-endian). */
static void write_idx(const char *path, bool gz, uint32_t magic, const uint32_t *dims, int ndim, const void *payload,
                      size_t payload_n)
{
    size_t n = 4 + 4 * (size_t)ndim + payload_n;
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(magic >> (24 - 8 * i));
    for (int d = 0; d < ndim; d++)
        for (int i = 0; i < 4; i++) b[4 + 4 * d + i] = (uint8_t)(dims[d] >> (24 - 8 * i));
    if (payload_n) memcpy(b + 4 + 4 * ndim, payload, payload_n);
    write_bytes(path, gz, b, n);
    free(b);
}

static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

static const uint8_t PIX[12] = {0, 255, 51, 102, 1, 2, 3, 4, 200, 100, 50, 25}; /* 3 images 2x2 */
static const uint8_t LAB[3] = {7, 0, 3};

/* ---- IDX --------------------------------------------------------------------- */

static void test_idx_plain_and_gz(void **state)
{
    (void)state;
    for (int gz = 0; gz < 2; gz++) {
        const char *p = em_test_tmp_path(gz ? "img.idx3.gz" : "img.idx3");
        write_idx(p, gz, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3, 2, 2}, 3, PIX, 12);
        em_idx idx;
        assert_int_equal(em_idx_read(p, EM_IDX_MAGIC_IMAGES, &idx), EM_OK);
        assert_int_equal(idx.type, EM_IDX_U8);
        assert_int_equal(idx.ndim, 3);
        assert_int_equal(idx.dims[0], 3);
        assert_int_equal(idx.dims[1], 2);
        assert_int_equal(idx.dims[2], 2);
        assert_int_equal(idx.numel, 12);
        assert_int_equal(idx.nbytes, 12);
        assert_memory_equal(idx.data, PIX, 12);
        em_idx_free(&idx);
        assert_null(idx.data);
        /* any magic accepted with 0 */
        assert_int_equal(em_idx_read(p, 0, &idx), EM_OK);
        assert_int_equal(idx.magic, EM_IDX_MAGIC_IMAGES);
        em_idx_free(&idx);
    }
    /* multi-byte type: big-endian in the file, host order in memory */
    const uint8_t be[8] = {0x01, 0x02, 0x03, 0x04, 0xFF, 0xFF, 0xFF, 0xFE};
    write_idx(em_test_tmp_path("i32.idx"), false, 0x00000C01, (const uint32_t[]){2}, 1, be, 8);
    em_idx idx;
    assert_int_equal(em_idx_read(em_test_tmp_path("i32.idx"), 0, &idx), EM_OK);
    assert_int_equal(idx.type, EM_IDX_I32);
    assert_int_equal(idx.elem_size, 4);
    assert_int_equal(((int32_t *)idx.data)[0], 0x01020304);
    assert_int_equal(((int32_t *)idx.data)[1], -2);
    em_idx_free(&idx);
}

static void test_idx_errors(void **state)
{
    (void)state;
    em_idx idx;
    /* missing file */
    const char *missing = em_test_tmp_path("nope-idx3-ubyte.gz");
    assert_int_equal(em_idx_read(missing, 0, &idx), EM_ERR_IO);
    assert_msg_has(missing);
    assert_null(idx.data);

    /* wrong magic: a labels file read as images */
    const char *lab = em_test_tmp_path("labels.idx1");
    write_idx(lab, false, EM_IDX_MAGIC_LABELS, (const uint32_t[]){3}, 1, LAB, 3);
    assert_int_equal(em_idx_read(lab, EM_IDX_MAGIC_IMAGES, &idx), EM_ERR_FORMAT);
    assert_msg_has(lab);
    assert_msg_has("wrong magic number 0x00000801, expected 0x00000803");
    /* not an IDX file at all */
    const char *junk = em_test_tmp_path("junk.idx");
    write_bytes(junk, false, "PK\x03\x04 hello", 10);
    assert_int_equal(em_idx_read(junk, 0, &idx), EM_ERR_FORMAT);
    assert_msg_has("not an IDX file");
    /* unknown element type */
    write_idx(junk, false, 0x00000701, (const uint32_t[]){1}, 1, "x", 1);
    assert_int_equal(em_idx_read(junk, 0, &idx), EM_ERR_FORMAT);
    assert_msg_has("unknown IDX element type 0x07");
    /* rank 0 */
    write_idx(junk, false, 0x00000800, NULL, 0, NULL, 0);
    assert_int_equal(em_idx_read(junk, 0, &idx), EM_ERR_FORMAT);
    assert_msg_has("rank 0");
    /* header shorter than the magic, and than the dims */
    write_bytes(junk, false, "\0\0", 2);
    assert_int_equal(em_idx_read(junk, 0, &idx), EM_ERR_FORMAT);
    assert_msg_has("truncated");
    write_idx(junk, false, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3}, 1, NULL, 0);
    assert_int_equal(em_idx_read(junk, EM_IDX_MAGIC_IMAGES, &idx), EM_ERR_FORMAT);
    assert_msg_has("truncated header: expected 12 bytes of dimensions, got 4");

    /* truncated data, plain and gz */
    for (int gz = 0; gz < 2; gz++) {
        const char *p = em_test_tmp_path(gz ? "trunc-images-idx3-ubyte.gz" : "trunc-images-idx3-ubyte");
        write_idx(p, gz, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3, 2, 2}, 3, PIX, 5);
        assert_int_equal(em_idx_read(p, EM_IDX_MAGIC_IMAGES, &idx), EM_ERR_FORMAT);
        assert_msg_has(p);
        assert_msg_has("truncated: expected 12 bytes of pixels, got 5");
        assert_null(idx.data);
    }
    /* a header that claims 4 GB of data in a tiny file: error, no huge allocation */
    write_idx(junk, false, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){60000, 65535, 65535}, 3, PIX, 12);
    assert_int_equal(em_idx_read(junk, EM_IDX_MAGIC_IMAGES, &idx), EM_ERR_FORMAT);
    assert_msg_has("truncated: expected 257690173500000 bytes of pixels, got 12");

    /* a gzip stream cut in the middle */
    {
        uint8_t big[4096];
        for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7919u >> 3);
        const char *p = em_test_tmp_path("cut.idx.gz");
        write_idx(p, true, 0x00000801, (const uint32_t[]){4096}, 1, big, sizeof big);
        FILE *f = fopen(p, "rb");
        assert_non_null(f);
        uint8_t raw[8192];
        size_t n = fread(raw, 1, sizeof raw, f);
        fclose(f);
        write_bytes(p, false, raw, n / 2);
        assert_int_equal(em_idx_read(p, 0, &idx), EM_ERR_FORMAT);
        assert_msg_has(p);
    }
    /* bytes after the data */
    uint8_t more[14];
    memcpy(more, PIX, 12);
    more[12] = more[13] = 9;
    write_idx(junk, false, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3, 2, 2}, 3, more, 14);
    assert_int_equal(em_idx_read(junk, EM_IDX_MAGIC_IMAGES, &idx), EM_ERR_FORMAT);
    assert_msg_has("2 bytes after the 12 bytes of data");
}

/* ---- MNIST-format dataset ------------------------------------------------------------ */

static void test_mnist_tiny(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/mnist", em_test_tmp_dir());
    assert_int_equal(mkdir(dir, 0755), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
    write_idx(p, true, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3, 2, 2}, 3, PIX, 12);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir); /* plain */
    write_idx(p, false, EM_IDX_MAGIC_LABELS, (const uint32_t[]){3}, 1, LAB, 3);

    em_dataset *ds = em_mnist_open(dir, true);
    if (!ds) fail_msg("em_mnist_open: %s", em_last_error());
    assert_int_equal(em_dataset_length(ds), 3);
    assert_int_equal(em_dataset_num_features(ds), 4);
    assert_int_equal(ds->feature_ndim, 3);
    assert_int_equal(ds->feature_shape[0], 1);
    assert_int_equal(ds->feature_shape[1], 2);
    assert_int_equal(ds->feature_shape[2], 2);
    assert_int_equal(ds->num_classes, 8);
    float x[4];
    int64_t y;
    assert_int_equal(em_dataset_get(ds, 0, x, &y), EM_OK);
    assert_int_equal(y, 7);
    assert_true(x[0] == 0.0f && x[1] == 1.0f && x[2] == 51.0f / 255.0f && x[3] == 102.0f / 255.0f);
    assert_int_equal(em_dataset_get(ds, 2, x, &y), EM_OK);
    assert_int_equal(y, 3);
    assert_true(x[0] == 200.0f / 255.0f);
    assert_int_equal(em_dataset_get(ds, 3, x, &y), EM_ERR_INVALID);
    assert_msg_has("index 3 out of range");
    assert_int_equal(em_dataset_get(ds, -1, x, &y), EM_ERR_INVALID);

    /* subset */
    em_dataset *sub = em_dataset_subset(ds, 1, 2);
    assert_non_null(sub);
    assert_int_equal(em_dataset_length(sub), 2);
    assert_int_equal(em_dataset_get(sub, 1, x, &y), EM_OK);
    assert_int_equal(y, 3);
    assert_null(em_dataset_subset(ds, 2, 2));
    assert_msg_has("outside the dataset");
    em_dataset_free(sub);
    em_dataset_free(ds);

    /* test split missing */
    assert_null(em_mnist_open(dir, false));
    assert_int_equal(em_last_status(), EM_ERR_IO);
    assert_msg_has("t10k-images-idx3-ubyte");
    assert_msg_has(dir);

    /* image / label count mismatch */
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    write_idx(p, false, EM_IDX_MAGIC_IMAGES, (const uint32_t[]){3, 2, 2}, 3, PIX, 12);
    char pl[400];
    snprintf(pl, sizeof pl, "%s/t10k-labels-idx1-ubyte.gz", dir);
    write_idx(pl, true, EM_IDX_MAGIC_LABELS, (const uint32_t[]){2}, 1, LAB, 2);
    assert_null(em_mnist_open(dir, false));
    assert_int_equal(em_last_status(), EM_ERR_FORMAT);
    assert_msg_has("has 2 labels but");
    assert_msg_has("has 3 images");
    assert_msg_has(pl);
    /* swapped files: wrong magic, naming the file */
    assert_null(em_mnist_open_files(pl, p));
    assert_msg_has(pl);
    assert_msg_has("wrong magic");
}

static void test_fashion_mnist_real(void **state)
{
    (void)state;
    char p[512];
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", EM_FASHION_MNIST_DIR);
    if (access(p, R_OK) != 0) {
        print_message("Fashion-MNIST not found in %s: skipped\n", EM_FASHION_MNIST_DIR);
        skip();
    }
    static const int64_t want_n[2] = {10000, 60000};
    static const int64_t first_labels[2][10] = {{9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}};
    for (int train = 0; train < 2; train++) {
        em_dataset *ds = em_mnist_open(NULL, train);
        if (!ds) fail_msg("em_mnist_open: %s", em_last_error());
        int64_t n = em_dataset_length(ds);
        assert_int_equal(n, want_n[train]);
        assert_int_equal(em_dataset_num_features(ds), 784);
        assert_int_equal(ds->num_classes, 10);
        float x[784];
        int64_t y, counts[10] = {0};
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_int_equal(em_dataset_get(ds, i, x, &y), EM_OK);
            assert_true(y >= 0 && y <= 9);
            counts[y]++;
            if (i < 10) assert_int_equal(y, first_labels[train][i]);
            for (int k = 0; k < 784; k++) {
                assert_true(x[k] >= 0.0f && x[k] <= 1.0f);
                sum += x[k];
            }
        }
        for (int c = 0; c < 10; c++) assert_int_equal(counts[c], n / 10); /* balanced classes */
        double mean = sum / ((double)n * 784);
        assert_true(mean > 0.27 && mean < 0.30); /* 0.2860 on train */
        em_dataset_free(ds);
    }
}

/* ---- CSV ------------------------------------------------------------------------- */

static void write_text(const char *path, const char *s) { write_bytes(path, false, s, strlen(s)); }

static void test_csv(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("ok.csv");
    write_text(p, "a,b,label,c\r\n1.5, 2,0,-3\r\n\r\n\"4\",5e1,2,6\n7,8,1,9");
    em_csv_options o = em_csv_options_default();
    o.has_header = true;
    o.label_column = 2;
    em_dataset *ds = em_csv_open(p, &o);
    if (!ds) fail_msg("em_csv_open: %s", em_last_error());
    assert_int_equal(em_dataset_length(ds), 3);
    assert_int_equal(em_dataset_num_features(ds), 3);
    assert_int_equal(ds->num_classes, 3);
    float x[3];
    int64_t y;
    assert_int_equal(em_dataset_get(ds, 0, x, &y), EM_OK);
    assert_true(x[0] == 1.5f && x[1] == 2.0f && x[2] == -3.0f);
    assert_int_equal(y, 0);
    assert_int_equal(em_dataset_get(ds, 1, x, &y), EM_OK);
    assert_true(x[0] == 4.0f && x[1] == 50.0f && x[2] == 6.0f);
    assert_int_equal(y, 2);
    em_dataset_free(ds);

    /* default: label last, no header, ';' delimiter */
    write_text(p, "1;2;3\n4;5;6\n");
    o = em_csv_options_default();
    o.delimiter = ';';
    ds = em_csv_open(p, &o);
    assert_non_null(ds);
    assert_int_equal(em_dataset_get(ds, 1, x, &y), EM_OK);
    assert_true(x[0] == 4.0f && x[1] == 5.0f);
    assert_int_equal(y, 6);
    em_dataset_free(ds);

    /* errors */
    const char *bad = em_test_tmp_path("bad.csv");
    write_text(bad, "x,y,l\n1,2,0\n3,4,1\n5,6\n");
    o = em_csv_options_default();
    o.has_header = true;
    assert_null(em_csv_open(bad, &o));
    assert_int_equal(em_last_status(), EM_ERR_FORMAT);
    assert_msg_has(bad);
    assert_msg_has(":4: 2 cells, expected 3 (as on line 2)");

    write_text(bad, "1,2,0\n3,abc,1\n");
    assert_null(em_csv_open(bad, NULL));
    assert_msg_has(":2: column 2: 'abc' is not a number");
    write_text(bad, "1,2,0\n3,,1\n");
    assert_null(em_csv_open(bad, NULL));
    assert_msg_has(":2: column 2: '' is not a number");
    write_text(bad, "1,2,0.5\n");
    assert_null(em_csv_open(bad, NULL));
    assert_msg_has(":1: column 3: label '0.5' is not an integer");
    write_text(bad, "1,2,3\n");
    o = em_csv_options_default();
    o.label_column = 3;
    assert_null(em_csv_open(bad, &o));
    assert_msg_has("label column 3 outside the 3 columns");
    write_text(bad, "h1,h2\n\n");
    o.has_header = true;
    o.label_column = -1;
    assert_null(em_csv_open(bad, &o));
    assert_msg_has("no data rows");
    assert_null(em_csv_open(em_test_tmp_path("absent.csv"), NULL));
    assert_int_equal(em_last_status(), EM_ERR_IO);
    assert_msg_has("absent.csv");
}

/* ---- loader ------------------------------------------------------------------------ */

/* n samples, x[i] = {i, -i}, y = i % 10 */
static em_dataset *counting_ds(int64_t n)
{
    float *x = malloc(sizeof(float) * 2 * (size_t)n);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[2 * i] = (float)i;
        x[2 * i + 1] = (float)-i;
        y[i] = i % 10;
    }
    em_dataset *ds = em_dataset_from_arrays(x, y, n, (const int64_t[]){2}, 1);
    free(x);
    free(y);
    assert_non_null(ds);
    return ds;
}

/* Runs one epoch, returns the concatenated sample indices (checking that x/y
 * match the indices); *nb gets the number of batches and sizes[] their sizes. */
static int64_t *run_epoch(em_loader *l, int64_t epoch, int64_t *count, int64_t *nb, int64_t *sizes)
{
    assert_int_equal(em_loader_start_epoch(l, epoch), EM_OK);
    int64_t cap = 4096, n = 0, k = 0;
    int64_t *out = malloc(sizeof(int64_t) * (size_t)cap);
    const em_batch *b;
    while ((b = em_loader_next(l))) {
        assert_int_equal(b->index, k);
        assert_int_equal(b->epoch, epoch);
        assert_int_equal(b->num_features, 2);
        if (sizes) sizes[k] = b->size;
        for (int64_t i = 0; i < b->size; i++) {
            int64_t idx = b->indices[i];
            assert_true(b->x[2 * i] == (float)idx);
            assert_true(b->x[2 * i + 1] == (float)-idx);
            assert_int_equal(b->y[i], idx % 10);
            assert_true(n < cap);
            out[n++] = idx;
        }
        k++;
    }
    assert_int_equal(em_last_status(), EM_OK);
    assert_null(em_loader_next(l)); /* stays at the end */
    *count = n;
    if (nb) *nb = k;
    return out;
}

static void test_loader_batches(void **state)
{
    (void)state;
    em_dataset *ds = counting_ds(10);
    for (int workers = 0; workers <= 2; workers += 2) {
        em_loader_options o = em_loader_options_default();
        o.batch_size = 4;
        o.num_workers = workers;
        em_loader *l = em_loader_new(ds, &o);
        assert_non_null(l);
        assert_int_equal(em_loader_num_batches(l), 3);
        assert_int_equal(em_loader_num_samples(l), 10);
        int64_t n, nb, sizes[8];
        int64_t *idx = run_epoch(l, 0, &n, &nb, sizes);
        assert_int_equal(n, 10);
        assert_int_equal(nb, 3);
        assert_int_equal(sizes[0], 4);
        assert_int_equal(sizes[1], 4);
        assert_int_equal(sizes[2], 2);
        for (int64_t i = 0; i < 10; i++) assert_int_equal(idx[i], i); /* no shuffle: in order */
        free(idx);
        em_loader_free(l);

        o.drop_last = true;
        l = em_loader_new(ds, &o);
        assert_int_equal(em_loader_num_batches(l), 2);
        idx = run_epoch(l, 0, &n, &nb, sizes);
        assert_int_equal(n, 8);
        assert_int_equal(nb, 2);
        assert_int_equal(sizes[1], 4);
        free(idx);
        em_loader_free(l);
    }
    /* normalisation, scalar and per feature */
    em_loader_options o = em_loader_options_default();
    o.batch_size = 10;
    o.mean = 1.0f;
    o.std = 2.0f;
    em_loader *l = em_loader_new(ds, &o);
    const em_batch *b = em_loader_next(l); /* starts epoch 0 by itself */
    assert_non_null(b);
    assert_int_equal(b->size, 10);
    assert_true(b->x[2 * 5] == 2.0f && b->x[2 * 5 + 1] == -3.0f);
    em_loader_free(l);
    o.feature_mean = (const float[]){0.0f, 1.0f};
    o.feature_std = (const float[]){2.0f, 0.5f};
    l = em_loader_new(ds, &o);
    b = em_loader_next(l);
    assert_true(b->x[2 * 3] == 1.5f && b->x[2 * 3 + 1] == -8.0f);
    em_loader_free(l);
    /* bad options */
    o = em_loader_options_default();
    o.batch_size = 0;
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("batch_size 0");
    o = em_loader_options_default();
    o.world_size = 2;
    o.rank = 2;
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("rank 2");
    o = em_loader_options_default();
    o.std = 0.0f;
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("std");
    em_dataset_free(ds);
}

static void test_loader_determinism(void **state)
{
    (void)state;
    const int64_t N = 103;
    em_dataset *ds = counting_ds(N);
    int64_t *ref[2] = {NULL, NULL};
    const int worker_counts[] = {0, 1, 3};
    const int prefetch[] = {0, 1, 2};
    for (int w = 0; w < 3; w++) {
        em_loader_options o = em_loader_options_default();
        o.batch_size = 8;
        o.shuffle = true;
        o.seed = 42;
        o.num_workers = worker_counts[w];
        o.prefetch = prefetch[w];
        em_loader *l = em_loader_new(ds, &o);
        assert_non_null(l);
        for (int e = 0; e < 2; e++) {
            int64_t n, nb;
            int64_t *idx = run_epoch(l, e, &n, &nb, NULL);
            assert_int_equal(n, N);
            assert_int_equal(nb, 13);
            /* a permutation */
            bool seen[103] = {false};
            for (int64_t i = 0; i < N; i++) {
                assert_true(idx[i] >= 0 && idx[i] < N && !seen[idx[i]]);
                seen[idx[i]] = true;
            }
            if (!ref[e]) ref[e] = idx;
            else {
                assert_memory_equal(idx, ref[e], sizeof(int64_t) * N);
                free(idx);
            }
        }
        em_loader_free(l);
    }
    /* shuffled, and epochs differ */
    int64_t inorder = 0;
    for (int64_t i = 0; i < N; i++) inorder += ref[0][i] == i;
    assert_true(inorder < N / 2);
    assert_true(memcmp(ref[0], ref[1], sizeof(int64_t) * N) != 0);
    /* another seed gives another order */
    em_loader_options o = em_loader_options_default();
    o.batch_size = 8;
    o.shuffle = true;
    o.seed = 43;
    em_loader *l = em_loader_new(ds, &o);
    int64_t n;
    int64_t *other = run_epoch(l, 0, &n, NULL, NULL);
    assert_true(memcmp(other, ref[0], sizeof(int64_t) * N) != 0);
    /* restarting the same epoch repeats it (also after abandoning it midway) */
    free(other);
    o.seed = 42;
    o.num_workers = 2;
    o.prefetch = 1;
    em_loader_free(l);
    l = em_loader_new(ds, &o);
    assert_int_equal(em_loader_start_epoch(l, 0), EM_OK);
    assert_non_null(em_loader_next(l));
    other = run_epoch(l, 0, &n, NULL, NULL);
    assert_memory_equal(other, ref[0], sizeof(int64_t) * N);
    free(other);
    /* free in the middle of an epoch with workers waiting on a full ring */
    assert_int_equal(em_loader_start_epoch(l, 1), EM_OK);
    assert_non_null(em_loader_next(l));
    usleep(20000);
    em_loader_free(l);
    free(ref[0]);
    free(ref[1]);
    em_dataset_free(ds);
}

static void test_loader_shards(void **state)
{
    (void)state;
    const int64_t N = 101;
    em_dataset *ds = counting_ds(N);
    for (int even = 0; even < 2; even++) {
        for (int workers = 0; workers <= 3; workers += 3) {
            int owner[101];
            for (int i = 0; i < N; i++) owner[i] = -1;
            int64_t total = 0;
            for (int rank = 0; rank < 2; rank++) {
                em_loader_options o = em_loader_options_default();
                o.batch_size = 7;
                o.shuffle = true;
                o.seed = 7;
                o.rank = rank;
                o.world_size = 2;
                o.shard_even = even;
                o.num_workers = workers;
                em_loader *l = em_loader_new(ds, &o);
                assert_non_null(l);
                int64_t n;
                int64_t *idx = run_epoch(l, 3, &n, NULL, NULL);
                assert_int_equal(n, em_loader_num_samples(l));
                if (even) assert_int_equal(n, 50);
                else assert_int_equal(n, rank == 0 ? 51 : 50);
                for (int64_t i = 0; i < n; i++) {
                    assert_int_equal(owner[idx[i]], -1); /* disjoint */
                    owner[idx[i]] = rank;
                }
                total += n;
                free(idx);
                em_loader_free(l);
            }
            int64_t covered = 0;
            for (int i = 0; i < N; i++) covered += owner[i] >= 0;
            assert_int_equal(covered, total);
            assert_int_equal(total, even ? 100 : N); /* exact union without shard_even */
        }
    }
    em_dataset_free(ds);
}

/* A dataset whose sample 5 cannot be read. */
static int64_t flaky_len(const em_dataset *ds) { (void)ds; return 20; }
static em_status flaky_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    (void)ds;
    if (i == 5) {
        em_clear_error(); /* no message: the loader supplies one */
        return EM_ERR_IO;
    }
    x[0] = (float)i;
    *y = 0;
    return EM_OK;
}
static void flaky_free(em_dataset *ds) { free(ds); }
static const em_dataset_vtable flaky_vt = {flaky_len, flaky_get, flaky_free};

static void test_loader_errors(void **state)
{
    (void)state;
    em_dataset *ds = malloc(sizeof *ds);
    assert_int_equal(em_dataset_init(ds, &flaky_vt, (const int64_t[]){1}, 1, 1), EM_OK);
    for (int workers = 0; workers <= 2; workers += 2) {
        em_loader_options o = em_loader_options_default();
        o.batch_size = 2;
        o.num_workers = workers;
        em_loader *l = em_loader_new(ds, &o);
        assert_non_null(l);
        assert_non_null(em_loader_next(l));
        assert_non_null(em_loader_next(l));
        assert_null(em_loader_next(l)); /* batch 2 holds sample 5 */
        assert_int_equal(em_last_status(), EM_ERR_IO);
        assert_msg_has("sample 5 (batch 2 of epoch 0)");
        assert_null(em_loader_next(l)); /* the epoch is over */
        assert_int_equal(em_last_status(), EM_ERR_IO);
        /* a new epoch works again up to the bad sample */
        assert_int_equal(em_loader_start_epoch(l, 1), EM_OK);
        assert_non_null(em_loader_next(l));
        em_loader_free(l);
    }
    em_dataset_free(ds);
    /* NULL arguments */
    assert_null(em_loader_new(NULL, NULL));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_null(em_loader_next(NULL));
    em_loader_free(NULL);
    em_dataset_free(NULL);
}

/* A dataset written outside Ember reports its own message with the public
 * em_set_error (ember/core.h); the loader keeps it after its own prefix. */
static em_status own_msg_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    (void)ds;
    if (i == 3) return em_set_error(EM_ERR_FORMAT, "record %lld has %d fields", (long long)i, 7);
    x[0] = (float)i;
    *y = 0;
    return EM_OK;
}
static const em_dataset_vtable own_msg_vt = {flaky_len, own_msg_get, flaky_free};

static void test_loader_dataset_error_message(void **state)
{
    (void)state;
    assert_int_equal(em_set_error(EM_ERR_IO, "plain %s", "message"), EM_ERR_IO);
    assert_int_equal(em_last_status(), EM_ERR_IO);
    assert_string_equal(em_last_error(), "plain message");
    em_clear_error();
    em_dataset *ds = malloc(sizeof *ds);
    assert_int_equal(em_dataset_init(ds, &own_msg_vt, (const int64_t[]){1}, 1, 1), EM_OK);
    em_loader_options o = em_loader_options_default();
    o.batch_size = 4;
    em_loader *l = em_loader_new(ds, &o);
    assert_non_null(l);
    assert_null(em_loader_next(l)); /* batch 0 holds sample 3 */
    assert_int_equal(em_last_status(), EM_ERR_FORMAT);
    assert_msg_has("sample 3 (batch 0 of epoch 0): record 3 has 7 fields");
    em_loader_free(l);
    em_dataset_free(ds);
}

static void test_batch_to_tensors(void **state)
{
    (void)state;
    float x[3 * 4];
    int64_t y[3] = {4, 5, 6};
    for (int i = 0; i < 12; i++) x[i] = (float)i * 0.5f;
    em_dataset *ds = em_dataset_from_arrays(x, y, 3, (const int64_t[]){1, 2, 2}, 3);
    assert_non_null(ds);
    em_loader_options o = em_loader_options_default();
    o.batch_size = 2;
    em_loader *l = em_loader_new(ds, &o);
    const em_batch *b = em_loader_next(l);
    assert_non_null(b);
    em_scope_begin();
    em_tensor *tx, *ty;
    if (em_batch_to_tensors(b, &tx, &ty) != EM_OK) fail_msg("em_batch_to_tensors: %s", em_last_error());
    assert_int_equal(em_tensor_dtype(tx), EM_F32);
    assert_int_equal(em_tensor_dtype(ty), EM_I64);
    em_test_assert_shape(tx, 4, SHAPE(2, 1, 2, 2));
    em_test_assert_shape(ty, 1, SHAPE(2));
    em_test_assert_close(tx, VALS(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5), 0, 0);
    em_test_assert_close(ty, VALS(4, 5), 0, 0);
    b = em_loader_next(l); /* last, partial batch */
    assert_int_equal(b->size, 1);
    assert_int_equal(em_batch_to_tensors(b, &tx, NULL), EM_OK);
    em_test_assert_shape(tx, 4, SHAPE(1, 1, 2, 2));
    em_scope_end();
    assert_int_equal(em_batch_to_tensors(NULL, &tx, &ty), EM_ERR_INVALID);
    assert_null(tx);
    em_loader_free(l);
    em_dataset_free(ds);
}

static void test_fashion_mnist_loader(void **state)
{
    (void)state;
    em_dataset *ds = em_mnist_open(NULL, false);
    if (!ds) {
        print_message("Fashion-MNIST not available (%s): skipped\n", em_last_error());
        skip();
    }
    em_loader_options o = em_loader_options_default();
    o.batch_size = 256;
    o.shuffle = true;
    o.seed = 1;
    o.num_workers = 2;
    o.mean = EM_FASHION_MNIST_MEAN;
    o.std = EM_FASHION_MNIST_STD;
    em_loader *l = em_loader_new(ds, &o);
    assert_non_null(l);
    assert_int_equal(em_loader_num_batches(l), 40);
    assert_int_equal(em_loader_start_epoch(l, 0), EM_OK);
    const em_batch *b;
    int64_t n = 0;
    double sum = 0, sq = 0;
    while ((b = em_loader_next(l))) {
        assert_int_equal(b->num_features, 784);
        assert_int_equal(b->feature_ndim, 3);
        for (int64_t i = 0; i < b->size * 784; i++) {
            sum += b->x[i];
            sq += (double)b->x[i] * b->x[i];
        }
        n += b->size;
    }
    assert_int_equal(em_last_status(), EM_OK);
    assert_int_equal(n, 10000);
    double mean = sum / (n * 784.0), var = sq / (n * 784.0) - mean * mean;
    assert_true(fabs(mean) < 0.05);     /* normalised with the training-set constants */
    assert_true(fabs(var - 1.0) < 0.1);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- image transforms ------------------------------------------------------------ */

/* The loader's bounded draw (uniform in [0, bound] by rejection), replayed. */
static uint64_t replay_upto(uint64_t *st, uint64_t bound)
{
    uint64_t range = bound + 1, limit = UINT64_MAX - (UINT64_MAX % range);
    for (;;) {
        uint64_t r = em_splitmix64(st);
        if (r < limit) return r % range;
    }
}

/* x[c][y][x] of a C x H x W image shifted by (dy, dx) with zeros outside,
 * then mirrored when flip: the expected RandomCrop + flip result. */
static float shifted(const float *img, int64_t H, int64_t W, int64_t c, int64_t y, int64_t x, int64_t dy, int64_t dx, bool flip)
{
    if (flip) x = W - 1 - x;
    int64_t sy = y + dy, sx = x + dx;
    return sy >= 0 && sy < H && sx >= 0 && sx < W ? img[(c * H + sy) * W + sx] : 0.0f;
}

static void test_image_transform_pixels(void **state)
{
    (void)state;
    enum { C = 2, H = 3, W = 4, N = C * H * W };
    float img[N], x[N], tmp[N];
    for (int i = 0; i < N; i++) img[i] = (float)(i + 1);
    /* flip only, always: each row mirrored */
    em_image_transform t = {.channels = C, .height = H, .width = W, .hflip_p = 1.0};
    uint64_t st = 1;
    memcpy(x, img, sizeof x);
    assert_int_equal(em_image_transform_apply(&t, x, tmp, &st), EM_OK);
    const float flipped_row0[W] = {4, 3, 2, 1}, flipped_row5[W] = {24, 23, 22, 21};
    assert_memory_equal(x, flipped_row0, sizeof flipped_row0);
    assert_memory_equal(x + 5 * W, flipped_row5, sizeof flipped_row5);
    /* a crop with padding 1: every one of the 9 offsets appears over enough
     * streams, each one exactly the shifted image with zero fill, the offset
     * and flip being the stream's first draws (top, left, then the flip) */
    t.crop_padding = 1;
    t.hflip_p = 0.5;
    bool seen[3][3][2] = {{{false}}};
    for (uint64_t seed = 0; seed < 400; seed++) {
        uint64_t s0 = em_image_transform_state(seed, 3, 7), s1 = s0;
        int64_t dy = (int64_t)replay_upto(&s1, 2) - 1, dx = (int64_t)replay_upto(&s1, 2) - 1;
        bool flip = (double)(em_splitmix64(&s1) >> 11) * 0x1.0p-53 < 0.5;
        memcpy(x, img, sizeof x);
        assert_int_equal(em_image_transform_apply(&t, x, tmp, &s0), EM_OK);
        assert_true(s0 == s1); /* three draws consumed */
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < H; y++)
                for (int64_t xx = 0; xx < W; xx++)
                    assert_true(x[(c * H + y) * W + xx] == shifted(img, H, W, c, y, xx, dy, dx, flip));
        seen[dy + 1][dx + 1][flip] = true;
    }
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int f = 0; f < 2; f++) assert_true(seen[a][b][f]);
    /* a hand-checked case: shifted down-right by one (dy = dx = -1: the
     * window starts in the padding), no flip */
    const float expect_c0[H * W] = {0, 0, 0, 0, 0, 1, 2, 3, 0, 5, 6, 7};
    for (int i = 0; i < H * W; i++) assert_true(shifted(img, H, W, 0, i / W, i % W, -1, -1, false) == expect_c0[i]);
    /* the state is a function of (seed, epoch, position) only, and each matters */
    assert_true(em_image_transform_state(5, 2, 9) == em_image_transform_state(5, 2, 9));
    assert_true(em_image_transform_state(5, 2, 9) != em_image_transform_state(6, 2, 9));
    assert_true(em_image_transform_state(5, 2, 9) != em_image_transform_state(5, 3, 9));
    assert_true(em_image_transform_state(5, 2, 9) != em_image_transform_state(5, 2, 10));
    /* bad transforms */
    em_image_transform bad = {.channels = 0, .height = H, .width = W};
    assert_int_equal(em_image_transform_apply(&bad, x, tmp, &st), EM_ERR_INVALID);
}

static void test_image_transform_normalize(void **state)
{
    (void)state;
    enum { C = 2, H = 2, W = 3, N = C * H * W };
    float img[N], x[N];
    for (int i = 0; i < N; i++) img[i] = 0.25f * (float)i;
    const float mean[C] = {0.5f, 1.0f}, sd[C] = {2.0f, 4.0f};
    em_image_transform t = {.channels = C, .height = H, .width = W, .mean = mean, .std = sd};
    uint64_t st = 0;
    memcpy(x, img, sizeof x);
    assert_int_equal(em_image_transform_apply(&t, x, NULL, &st), EM_OK);
    assert_true(st == 0); /* no random draw */
    for (int i = 0; i < N; i++) {
        int c = i / (H * W);
        assert_true(x[i] == (img[i] - mean[c]) / sd[c]);
    }
    /* eval form: the random parts off, normalisation kept */
    em_image_transform r = t;
    r.crop_padding = 4;
    r.hflip_p = 0.5;
    em_image_transform e = em_image_transform_eval(r);
    assert_int_equal(e.crop_padding, 0);
    assert_true(e.hflip_p == 0);
    assert_ptr_equal(e.mean, mean);
    assert_ptr_equal(e.std, sd);
}

/* An image dataset: n samples of 1 x 6 x 6, pixel values distinct per sample. */
static em_dataset *image_ds(int64_t n, float **pix)
{
    float *x = malloc(sizeof(float) * (size_t)(n * 36));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n * 36; i++) x[i] = (float)(i % 997) / 997.0f + 0.001f;
    for (int64_t i = 0; i < n; i++) y[i] = i % 10;
    const int64_t shape[3] = {1, 6, 6};
    em_dataset *ds = em_dataset_from_arrays(x, y, n, shape, 3);
    free(y);
    *pix = x;
    return ds;
}

/* All of an epoch's x values (n * 36 floats) and indices. */
static float *epoch_images(em_loader *l, int64_t epoch, int64_t *idx_out)
{
    int64_t m = em_loader_num_samples(l), k = 0;
    float *all = malloc(sizeof(float) * (size_t)(m * 36));
    assert_int_equal(em_loader_start_epoch(l, epoch), EM_OK);
    const em_batch *b;
    while ((b = em_loader_next(l))) {
        memcpy(all + k * 36, b->x, sizeof(float) * (size_t)(b->size * 36));
        if (idx_out) memcpy(idx_out + k, b->indices, sizeof(int64_t) * (size_t)b->size);
        k += b->size;
    }
    assert_int_equal(em_last_status(), EM_OK);
    assert_int_equal(k, m);
    return all;
}

static void test_loader_transform_determinism(void **state)
{
    (void)state;
    const int64_t N = 50;
    float *pix;
    em_dataset *ds = image_ds(N, &pix);
    const float mean[1] = {0.25f}, sd[1] = {0.5f};
    em_loader_options o = em_loader_options_default();
    o.batch_size = 7;
    o.shuffle = true;
    o.seed = 11;
    o.transform = (em_image_transform){.crop_padding = 2, .hflip_p = 0.5, .mean = mean, .std = sd}; /* sizes from the dataset */
    float *ref[2] = {NULL, NULL};
    int64_t idx[50];
    const int workers[] = {1, 3, 0};
    for (int w = 0; w < 3; w++) {
        o.num_workers = workers[w];
        em_loader *l = em_loader_new(ds, &o);
        assert_non_null(l);
        for (int e = 0; e < 2; e++) {
            float *x = epoch_images(l, e, idx);
            if (!ref[e]) ref[e] = x;
            else {
                assert_memory_equal(x, ref[e], sizeof(float) * (size_t)(N * 36)); /* 1 and 3 workers, and none: identical batches */
                free(x);
            }
        }
        em_loader_free(l);
    }
    /* the documented contract: the sample at position p of epoch e is
     * em_image_transform_apply of its raw image with the stream
     * em_image_transform_state(seed, e, p) */
    o.num_workers = 0;
    em_loader *l = em_loader_new(ds, &o);
    float *x1 = epoch_images(l, 1, idx);
    em_image_transform t = {.channels = 1, .height = 6, .width = 6, .crop_padding = 2, .hflip_p = 0.5, .mean = mean, .std = sd};
    int changed = 0;
    for (int64_t p = 0; p < N; p++) {
        float want[36], tmp[36];
        memcpy(want, pix + idx[p] * 36, sizeof want);
        uint64_t st = em_image_transform_state(11, 1, p);
        assert_int_equal(em_image_transform_apply(&t, want, tmp, &st), EM_OK);
        assert_memory_equal(x1 + p * 36, want, sizeof want);
        float plain[36];
        for (int i = 0; i < 36; i++) plain[i] = (pix[idx[p] * 36 + i] - 0.25f) / 0.5f;
        changed += memcmp(plain, want, sizeof want) != 0;
    }
    assert_true(changed > N / 2); /* most samples are cropped off-centre or flipped */
    assert_memory_equal(x1, ref[1], sizeof(float) * (size_t)(N * 36));
    assert_true(memcmp(ref[0], ref[1], sizeof(float) * (size_t)(N * 36)) != 0);
    free(x1);
    em_loader_free(l);
    /* sharding: rank 1 of 2 gets the draws of the unsharded positions 1, 3, ... */
    o.world_size = 2;
    o.rank = 1;
    l = em_loader_new(ds, &o);
    int64_t sidx[25];
    float *xs = epoch_images(l, 1, sidx);
    for (int64_t q = 0; q < 25; q++) {
        assert_int_equal(sidx[q], idx[1 + 2 * q]);
        assert_memory_equal(xs + q * 36, ref[1] + (1 + 2 * q) * 36, sizeof(float) * 36);
    }
    free(xs);
    em_loader_free(l);
    /* an evaluation loader: no random transforms, whatever the seed and epoch */
    o.world_size = 1;
    o.rank = 0;
    o.shuffle = false;
    o.transform = em_image_transform_eval(o.transform);
    for (uint64_t seed = 0; seed < 2; seed++) {
        o.seed = seed;
        l = em_loader_new(ds, &o);
        for (int e = 0; e < 2; e++) {
            float *xe = epoch_images(l, e, idx);
            for (int64_t i = 0; i < N * 36; i++) assert_true(xe[i] == (pix[i] - 0.25f) / 0.5f);
            free(xe);
        }
        em_loader_free(l);
    }
    /* bad transform options */
    o.transform = (em_image_transform){.channels = 2, .height = 6, .width = 6};
    o.transform.hflip_p = 0.5;
    assert_null(em_loader_new(ds, &o));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_msg_has("does not match");
    o.transform = (em_image_transform){.mean = mean};
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("both");
    o.transform = (em_image_transform){.hflip_p = 1.5};
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("hflip_p");
    const float zero[1] = {0};
    o.transform = (em_image_transform){.mean = mean, .std = zero};
    assert_null(em_loader_new(ds, &o));
    assert_msg_has("std[0]");
    free(ref[0]);
    free(ref[1]);
    free(pix);
    em_dataset_free(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_plain_and_gz),    cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_mnist_tiny),          cmocka_unit_test(test_fashion_mnist_real),
        cmocka_unit_test(test_csv),                 cmocka_unit_test(test_loader_batches),
        cmocka_unit_test(test_loader_determinism),  cmocka_unit_test(test_loader_shards),
        cmocka_unit_test(test_loader_errors),       cmocka_unit_test(test_batch_to_tensors),
        cmocka_unit_test(test_loader_dataset_error_message),
        cmocka_unit_test(test_fashion_mnist_loader),
        cmocka_unit_test(test_image_transform_pixels),
        cmocka_unit_test(test_image_transform_normalize),
        cmocka_unit_test(test_loader_transform_determinism),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
