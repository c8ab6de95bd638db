/* Reader of the PyTorch fixture files in tests/fixtures (written by the
 * gen_*_fixtures.py scripts with Debian's python3-torch). Format, one block
 * per case:
 *     config <name>
 *     <kind> <name> key value key value ...     (the head line: opt/lossfn/op)
 *     dtype float32|float64                     (optional)
 *     <tensor> <ndim> <dims...> : <values...>   (any number)
 *     end
 * Files are found through EMBER_TEST_DATA (set by CTest). Errors fail the
 * calling cmocka test. */
#ifndef EMBER_TEST_FIXTURE_H
#define EMBER_TEST_FIXTURE_H

#include "testutil.h"

#define FX_MAX_T 64 /* a 2-layer TransformerEncoder block: 58 */

typedef struct fx_tensor {
    char name[32];
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t n;
    double *v;
} fx_tensor;

typedef struct fx_block {
    char config[64];
    char head[512];
    char dtype[16];
    fx_tensor t[FX_MAX_T];
    int nt;
} fx_block;

/* Loads every block of @p fname; returns the count, *out to fx_free. */
int fx_load(const char *fname, fx_block **out);
void fx_free(fx_block *bs, int n);
/* Tensor by name, or NULL / failing the test when absent. */
const fx_tensor *fx_find(const fx_block *b, const char *name);
const fx_tensor *fx_get(const fx_block *b, const char *name);
/* The second word of the head line (the op / optimizer / loss name). */
void fx_op(const fx_block *b, char *out, size_t n);
/* Value of "key" among the head line's key/value pairs (copied), or NULL. */
const char *fx_kw_str(const fx_block *b, const char *key, char *out, size_t n);
double fx_kw(const fx_block *b, const char *key, double def);
/* A fixture tensor as an Ember tensor of dtype dt (current scope / caller). */
em_tensor *fx_new(const fx_tensor *t, em_dtype dt);
/* Fails (naming @p what) unless t has want's shape and every value is within
 * rtol * |want[i]| + stol * max |want| of it; returns the max abs error
 * relative to max |want| (the PyTorch-fixture check of the module tests). */
double fx_check_close(const em_tensor *t, const fx_tensor *want, double rtol, double stol, const char *what);
/* Fixture tensor @p name of block b as a new f32 leaf, requiring grad when @p grad. */
em_tensor *fx_leaf(const fx_block *b, const char *name, bool grad);
/* A mask fixture (stored as 0/1 or floats) as bool (kind "bool") or f32
 * ("float"); "none": NULL. */
em_tensor *fx_mask(const fx_block *b, const char *name, const char *kind);

#endif
