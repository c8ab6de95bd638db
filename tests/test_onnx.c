/* ONNX import (issue #19): em_onnx_load / em_onnx_run on models built here
 * with protobuf-c (an MLP, checked against a host reference, and fine-tuned
 * through em_onnx_module), and bad files: truncated and corrupted protobuf,
 * nesting bombs, external-data paths outside the model's folder, cycles,
 * undefined names, unsupported operators, wrong inputs. Each must give an
 * error naming the problem, never a crash. Also the .npy reader / writer. */
#include "testutil.h"

#include "onnx.pb-c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- building models --------------------------------------------------------------- */

static Onnx__TensorProto *mk_tensor(const char *name, const int64_t *dims, size_t nd, const float *v)
{
    Onnx__TensorProto *t = calloc(1, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = strdup(name);
    t->n_dims = nd;
    t->dims = calloc(nd + 1, sizeof(int64_t));
    size_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        t->dims[i] = dims[i];
        n *= (size_t)dims[i];
    }
    t->has_data_type = true;
    t->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    if (v) {
        t->n_float_data = n;
        t->float_data = calloc(n + 1, sizeof(float));
        memcpy(t->float_data, v, n * sizeof(float));
    }
    return t;
}

static Onnx__NodeProto *mk_node(const char *op, const char *name, int nin, const char *const *in, int nout,
                                const char *const *out)
{
    Onnx__NodeProto *n = calloc(1, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = strdup(op);
    n->name = strdup(name);
    n->n_input = (size_t)nin;
    n->input = calloc((size_t)nin + 1, sizeof(char *));
    for (int i = 0; i < nin; i++) n->input[i] = strdup(in[i]);
    n->n_output = (size_t)nout;
    n->output = calloc((size_t)nout + 1, sizeof(char *));
    for (int i = 0; i < nout; i++) n->output[i] = strdup(out[i]);
    return n;
}

static void node_attr_int(Onnx__NodeProto *n, const char *name, int64_t v)
{
    Onnx__AttributeProto *a = calloc(1, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = strdup(name);
    a->has_type = true;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = true;
    a->i = v;
    n->attribute = realloc(n->attribute, sizeof(*n->attribute) * (n->n_attribute + 1));
    n->attribute[n->n_attribute++] = a;
}

static Onnx__ValueInfoProto *mk_vi(const char *name, int elem, int nd, const int64_t *dims)
{
    Onnx__ValueInfoProto *vi = calloc(1, sizeof *vi);
    onnx__value_info_proto__init(vi);
    vi->name = strdup(name);
    Onnx__TypeProto *tp = calloc(1, sizeof *tp);
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = true;
    tt->elem_type = elem;
    if (nd >= 0) {
        Onnx__TensorShapeProto *sh = calloc(1, sizeof *sh);
        onnx__tensor_shape_proto__init(sh);
        sh->n_dim = (size_t)nd;
        sh->dim = calloc((size_t)nd + 1, sizeof *sh->dim);
        for (int i = 0; i < nd; i++) {
            Onnx__TensorShapeProto__Dimension *d = calloc(1, sizeof *d);
            onnx__tensor_shape_proto__dimension__init(d);
            if (dims[i] >= 0) {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                d->dim_value = dims[i];
            } else {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                d->dim_param = strdup("N");
            }
            sh->dim[i] = d;
        }
        tt->shape = sh;
    }
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->type = tp;
    return vi;
}

typedef struct model_b {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto op;
    Onnx__OperatorSetIdProto *ops[1];
} model_b;

static void mb_init(model_b *b, int opset)
{
    onnx__model_proto__init(&b->m);
    onnx__graph_proto__init(&b->g);
    onnx__operator_set_id_proto__init(&b->op);
    b->op.domain = strdup("");
    b->op.has_version = true;
    b->op.version = opset;
    b->ops[0] = &b->op;
    b->m.has_ir_version = true;
    b->m.ir_version = 8;
    b->m.n_opset_import = 1;
    b->m.opset_import = b->ops;
    b->m.graph = &b->g;
    b->g.name = strdup("test");
}

#define PUSH(arr, n, x)                                               \
    do {                                                              \
        (arr) = realloc((arr), sizeof(*(arr)) * ((n) + 1));           \
        (arr)[(n)++] = (x);                                           \
    } while (0)

static uint8_t *mb_pack(model_b *b, size_t *n)
{
    *n = onnx__model_proto__get_packed_size(&b->m);
    uint8_t *buf = malloc(*n + 1);
    onnx__model_proto__pack(&b->m, buf);
    return buf;
}

/* The MLP: logits = Gemm(Relu(Gemm(Flatten(x), fc1.weight^T, fc1.bias)), fc2.weight^T, fc2.bias). */
static const float W1[8 * 6] = {0.1f, -0.2f, 0.3f, 0.05f, -0.1f, 0.2f, 0.4f, 0.1f, -0.3f, 0.2f, 0.0f, -0.1f,
                                -0.2f, 0.3f, 0.1f, -0.4f, 0.2f, 0.1f, 0.3f, -0.1f, 0.2f, 0.1f, 0.05f, -0.2f,
                                0.2f, 0.2f, -0.1f, 0.3f, -0.3f, 0.1f, -0.1f, 0.4f, 0.2f, -0.2f, 0.1f, 0.3f,
                                0.05f, -0.05f, 0.1f, 0.2f, 0.3f, -0.3f, 0.25f, 0.15f, -0.35f, 0.1f, 0.2f, 0.0f};
static const float B1[8] = {0.01f, -0.02f, 0.03f, 0.0f, 0.1f, -0.1f, 0.05f, 0.02f};
static const float W2[3 * 8] = {0.2f, -0.1f, 0.3f, 0.1f, -0.2f, 0.05f, 0.1f, 0.2f, -0.3f, 0.2f, 0.1f, 0.0f,
                                0.1f, 0.3f, -0.1f, 0.2f, 0.1f, 0.1f, -0.2f, 0.3f, 0.2f, -0.1f, 0.05f, 0.1f};
static const float B2[3] = {0.0f, 0.1f, -0.1f};

static void build_mlp(model_b *b)
{
    mb_init(b, 17);
    int64_t d1[2] = {8, 6}, db1[1] = {8}, d2[2] = {3, 8}, db2[1] = {3};
    PUSH(b->g.initializer, b->g.n_initializer, mk_tensor("fc1.weight", d1, 2, W1));
    PUSH(b->g.initializer, b->g.n_initializer, mk_tensor("fc1.bias", db1, 1, B1));
    PUSH(b->g.initializer, b->g.n_initializer, mk_tensor("fc2.weight", d2, 2, W2));
    PUSH(b->g.initializer, b->g.n_initializer, mk_tensor("fc2.bias", db2, 1, B2));
    Onnx__NodeProto *f = mk_node("Flatten", "flatten", 1, (const char *[]){"x"}, 1, (const char *[]){"xf"});
    Onnx__NodeProto *g1 = mk_node("Gemm", "fc1", 3, (const char *[]){"xf", "fc1.weight", "fc1.bias"}, 1, (const char *[]){"h"});
    node_attr_int(g1, "transB", 1);
    Onnx__NodeProto *r = mk_node("Relu", "relu", 1, (const char *[]){"h"}, 1, (const char *[]){"hr"});
    Onnx__NodeProto *g2 = mk_node("Gemm", "fc2", 3, (const char *[]){"hr", "fc2.weight", "fc2.bias"}, 1, (const char *[]){"logits"});
    node_attr_int(g2, "transB", 1);
    PUSH(b->g.node, b->g.n_node, f);
    PUSH(b->g.node, b->g.n_node, g1);
    PUSH(b->g.node, b->g.n_node, r);
    PUSH(b->g.node, b->g.n_node, g2);
    PUSH(b->g.input, b->g.n_input, mk_vi("x", 1, 3, (int64_t[]){-1, 2, 3}));
    PUSH(b->g.output, b->g.n_output, mk_vi("logits", 1, 2, (int64_t[]){-1, 3}));
}

static void mlp_ref(const float *x, int n, float *out)
{
    for (int s = 0; s < n; s++) {
        float h[8];
        for (int j = 0; j < 8; j++) {
            float a = B1[j];
            for (int k = 0; k < 6; k++) a += x[s * 6 + k] * W1[j * 6 + k];
            h[j] = a > 0 ? a : 0;
        }
        for (int j = 0; j < 3; j++) {
            float a = B2[j];
            for (int k = 0; k < 8; k++) a += h[k] * W2[j * 8 + k];
            out[s * 3 + j] = a;
        }
    }
}

static em_onnx_model *load_bytes(const uint8_t *p, size_t n, const char **err)
{
    return em_onnx_load_memory(p, n, em_test_tmp_dir(), "test.onnx", err);
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_mlp_matches_reference(void **state)
{
    (void)state;
    model_b b;
    build_mlp(&b);
    size_t n;
    uint8_t *bytes = mb_pack(&b, &n);
    const char *err = NULL;
    em_onnx_model *m = load_bytes(bytes, n, &err);
    assert_non_null(m);
    assert_int_equal(em_onnx_num_inputs(m), 1);
    assert_string_equal(em_onnx_input_name(m, 0), "x");
    assert_string_equal(em_onnx_output_name(m, 0), "logits");
    assert_int_equal(em_onnx_opset(m), 17);
    assert_int_equal(em_onnx_num_initializers(m), 4);
    int64_t shp[EM_MAX_DIMS];
    assert_int_equal(em_onnx_input_shape(m, 0, shp), 3);
    assert_int_equal(shp[0], -1);
    assert_int_equal(shp[2], 3);
    float x[5 * 6], want[5 * 3];
    for (int i = 0; i < 30; i++) x[i] = (float)sin(i * 0.7) * 2.0f;
    mlp_ref(x, 5, want);
    em_tensor *xt = em_from_host(x, (int64_t[]){5, 2, 3}, 3, EM_F32), *y = NULL;
    em_no_grad_begin();
    assert_int_equal(em_onnx_run(m, &xt, 1, &y, 1), EM_OK);
    em_no_grad_end();
    em_test_assert_shape(y, 2, (int64_t[]){5, 3});
    double *got = em_test_values(y);
    for (int i = 0; i < 15; i++) assert_true(fabs(got[i] - want[i]) < 1e-5);
    free(got);
    /* the module: keys as PyTorch's, the same tensors the graph uses */
    em_module *mod = em_onnx_module(m);
    assert_non_null(em_module_get_param(mod, "fc1.weight"));
    assert_ptr_equal(em_module_get_param(mod, "fc2.bias"), em_onnx_initializer(m, 3));
    assert_int_equal(em_module_num_params(mod), 8 * 6 + 8 + 3 * 8 + 3);
    /* em_module_forward of a one-input model runs the graph */
    em_no_grad_begin();
    em_tensor *y2 = em_module_forward(mod, xt);
    em_no_grad_end();
    got = em_test_values(y2);
    for (int i = 0; i < 15; i++) assert_true(fabs(got[i] - want[i]) < 1e-5);
    free(got);
    em_tensor_release(y2);
    em_tensor_release(y);
    em_tensor_release(xt);
    em_onnx_free(m);
    free(bytes);
}

/* An imported model can be fine-tuned: gradients reach the initializers. */
static void test_mlp_fine_tunes(void **state)
{
    (void)state;
    model_b b;
    build_mlp(&b);
    size_t n;
    uint8_t *bytes = mb_pack(&b, &n);
    em_onnx_model *m = load_bytes(bytes, n, NULL);
    assert_non_null(m);
    em_module *mod = em_onnx_module(m);
    float x[4 * 6];
    for (int i = 0; i < 24; i++) x[i] = (float)cos(i * 0.3);
    int64_t yv[4] = {0, 1, 2, 1};
    em_tensor *xt = em_from_host(x, (int64_t[]){4, 2, 3}, 3, EM_F32);
    em_tensor *tg = em_from_host(yv, (int64_t[]){4}, 1, EM_I64);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_SGD);
    oc.lr = 0.5;
    em_optim *opt = em_optim_new_for_module(&oc, mod);
    assert_non_null(opt);
    double first = 0, last = 0;
    for (int step = 0; step < 20; step++) {
        em_scope_begin();
        em_tensor *logits = em_module_forward(mod, xt);
        em_tensor *loss = em_cross_entropy(logits, tg, NULL);
        assert_non_null(loss);
        em_grads *g = em_backward(loss);
        assert_non_null(g);
        assert_non_null(em_grad(g, em_module_get_param(mod, "fc1.weight")));
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        double l;
        assert_int_equal(em_item(loss, &l), EM_OK);
        if (step == 0) first = l;
        last = l;
        em_grads_free(g);
        em_scope_end();
    }
    if (!(last < first * 0.7)) fail_msg("loss %g -> %g", first, last);
    em_optim_free(opt);
    em_tensor_release(xt);
    em_tensor_release(tg);
    em_onnx_free(m);
    free(bytes);
}

/* Every prefix of a valid file, and many corrupted copies: an error or a
 * model, never a crash; a prefix that loads must still run or fail cleanly. */
static void test_truncated_and_corrupt(void **state)
{
    (void)state;
    model_b b;
    build_mlp(&b);
    size_t n;
    uint8_t *bytes = mb_pack(&b, &n);
    int failed = 0;
    for (size_t k = 0; k < n; k++) {
        const char *err = NULL;
        em_onnx_model *m = load_bytes(bytes, k, &err);
        if (!m) {
            assert_non_null(err);
            assert_true(strlen(err) > 0);
            failed++;
        }
        em_onnx_free(m);
    }
    assert_true(failed > (int)n / 2);
    const char *err = NULL;
    assert_null(load_bytes(bytes, n / 2, &err));
    uint8_t *c = malloc(n);
    uint64_t rng = 12345;
    for (int it = 0; it < 3000; it++) {
        memcpy(c, bytes, n);
        for (int f = 0; f < 1 + it % 4; f++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            c[(rng >> 33) % n] = (uint8_t)(rng >> 17);
        }
        em_onnx_model *m = load_bytes(c, n, &err);
        if (m) {
            float x[6] = {1, 2, 3, 4, 5, 6};
            em_tensor *xt = em_from_host(x, (int64_t[]){1, 2, 3}, 3, EM_F32), *y = NULL;
            em_no_grad_begin();
            if (em_onnx_num_inputs(m) == 1 && em_onnx_num_outputs(m) >= 1) {
                if (em_onnx_run(m, &xt, 1, &y, 1) != EM_OK) assert_true(strlen(em_last_error()) > 0);
            }
            em_no_grad_end();
            em_tensor_release(y);
            em_tensor_release(xt);
            em_onnx_free(m);
        }
    }
    free(c);
    /* not protobuf at all */
    const char *txt = "this is not an onnx file\n";
    assert_null(load_bytes((const uint8_t *)txt, strlen(txt), &err));
    assert_non_null(strstr(err, "test.onnx"));
    free(bytes);
}

/* graph -> node -> attribute(g) -> graph ... 5000 deep: refused before protobuf-c recurses. */
static void test_nesting_bomb(void **state)
{
    (void)state;
    /* built inside out: each level wraps the previous bytes in a length-delimited field */
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap), *tmp = malloc(cap);
    static const uint8_t fields[3] = {(6 << 3) | 2, /* AttributeProto.g */
                                      (5 << 3) | 2, /* NodeProto.attribute */
                                      (1 << 3) | 2 /* GraphProto.node */};
    for (int level = 0; level < 5000 * 3; level++) {
        uint8_t hdr[12];
        size_t h = 0;
        hdr[h++] = fields[level % 3];
        size_t len = n;
        do {
            hdr[h++] = (uint8_t)((len & 0x7f) | (len > 0x7f ? 0x80 : 0));
            len >>= 7;
        } while (len);
        assert_true(n + h < cap);
        memcpy(tmp, hdr, h);
        memcpy(tmp + h, buf, n);
        memcpy(buf, tmp, n + h);
        n += h;
    }
    /* ModelProto.graph = the outermost graph; ir_version 8 */
    uint8_t hdr[16];
    size_t h = 0;
    hdr[h++] = (1 << 3) | 0;
    hdr[h++] = 8;
    hdr[h++] = (7 << 3) | 2;
    size_t len = n;
    do {
        hdr[h++] = (uint8_t)((len & 0x7f) | (len > 0x7f ? 0x80 : 0));
        len >>= 7;
    } while (len);
    memcpy(tmp, hdr, h);
    memcpy(tmp + h, buf, n);
    const char *err = NULL;
    assert_null(load_bytes(tmp, n + h, &err));
    assert_non_null(strstr(err, "nested more than"));
    free(buf);
    free(tmp);
}

static void set_external(Onnx__TensorProto *t, const char *loc, const char *offset, const char *length)
{
    t->n_float_data = 0;
    t->has_data_location = true;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    const char *keys[3] = {"location", "offset", "length"}, *vals[3] = {loc, offset, length};
    for (int i = 0; i < 3; i++) {
        if (!vals[i]) continue;
        Onnx__StringStringEntryProto *e = calloc(1, sizeof *e);
        onnx__string_string_entry_proto__init(e);
        e->key = strdup(keys[i]);
        e->value = strdup(vals[i]);
        PUSH(t->external_data, t->n_external_data, e);
    }
}

static void expect_external_error(const char *loc, const char *offset, const char *length, const char *want, bool from_memory)
{
    model_b b;
    build_mlp(&b);
    set_external(b.g.initializer[2], loc, offset, length);
    size_t n;
    uint8_t *bytes = mb_pack(&b, &n);
    const char *err = NULL;
    em_onnx_model *m = from_memory ? em_onnx_load_memory(bytes, n, NULL, "mem.onnx", &err) : load_bytes(bytes, n, &err);
    if (want) {
        assert_null(m);
        if (!strstr(err, want)) fail_msg("expected '%s' in: %s", want, err);
        assert_non_null(strstr(err, "fc2.weight"));
    } else {
        assert_non_null(m);
        em_tensor *w = em_onnx_initializer(m, 2);
        double *v = em_test_values(w);
        for (int i = 0; i < 24; i++) assert_true(v[i] == W2[i]);
        free(v);
        em_onnx_free(m);
    }
    free(bytes);
}

static void test_external_data(void **state)
{
    (void)state;
    /* a good external file: 16 bytes of junk, then fc2.weight */
    FILE *f = fopen(em_test_tmp_path("weights.bin"), "wb");
    assert_non_null(f);
    char junk[16] = {0};
    fwrite(junk, 1, 16, f);
    fwrite(W2, sizeof(float), 24, f);
    fclose(f);
    expect_external_error("weights.bin", "16", "96", NULL, false);
    expect_external_error("../weights.bin", "16", "96", "must be a relative path inside the model's folder", false);
    expect_external_error("/etc/passwd", NULL, NULL, "must be a relative path inside the model's folder", false);
    expect_external_error("a/../../weights.bin", NULL, NULL, "must be a relative path inside", false);
    expect_external_error("missing.bin", NULL, NULL, "missing.bin", false);
    expect_external_error("weights.bin", "80", NULL, "is shorter than offset 80", false);
    expect_external_error("weights.bin", "16", "95", "external data length 95", false);
    expect_external_error("weights.bin", "x1", NULL, "is not a number", false);
    expect_external_error("weights.bin", NULL, NULL, "loaded from memory", true);
}

static void expect_load_error(model_b *b, em_status st, const char *want)
{
    size_t n;
    uint8_t *bytes = mb_pack(b, &n);
    const char *err = NULL;
    em_onnx_model *m = load_bytes(bytes, n, &err);
    assert_null(m);
    if (!strstr(err, want)) fail_msg("expected '%s' in: %s", want, err);
    assert_int_equal(em_last_status(), st);
    free(bytes);
}

static void test_graph_errors(void **state)
{
    (void)state;
    model_b b;
    /* a cycle: relu reads its own consumer's output */
    build_mlp(&b);
    free(b.g.node[2]->input[0]);
    b.g.node[2]->input[0] = strdup("logits");
    expect_load_error(&b, EM_ERR_FORMAT, "cycle");
    /* an undefined name */
    build_mlp(&b);
    free(b.g.node[1]->input[1]);
    b.g.node[1]->input[1] = strdup("fc1.wieght");
    expect_load_error(&b, EM_ERR_FORMAT, "input 'fc1.wieght' is not produced");
    /* an unsupported operator names node, operator and opset */
    build_mlp(&b);
    free(b.g.node[2]->op_type);
    b.g.node[2]->op_type = strdup("FooBar");
    expect_load_error(&b, EM_ERR_UNSUPPORTED, "node 'relu' (FooBar, opset 17): operator FooBar is not supported");
    /* another domain */
    build_mlp(&b);
    b.g.node[2]->domain = strdup("com.microsoft");
    expect_load_error(&b, EM_ERR_UNSUPPORTED, "domain 'com.microsoft'");
    /* two nodes writing one name */
    build_mlp(&b);
    free(b.g.node[2]->output[0]);
    b.g.node[2]->output[0] = strdup("h");
    expect_load_error(&b, EM_ERR_FORMAT, "output 'h' is already defined");
    /* a graph output nobody produces */
    build_mlp(&b);
    free(b.g.output[0]->name);
    b.g.output[0]->name = strdup("probs");
    expect_load_error(&b, EM_ERR_FORMAT, "graph output 'probs'");
    /* opsets out of range, no graph, a bad initializer */
    build_mlp(&b);
    b.op.version = 3;
    expect_load_error(&b, EM_ERR_UNSUPPORTED, "opset 3 is not supported");
    build_mlp(&b);
    b.m.graph = NULL;
    expect_load_error(&b, EM_ERR_FORMAT, "has no graph");
    build_mlp(&b);
    b.g.initializer[0]->n_float_data = 5;
    expect_load_error(&b, EM_ERR_FORMAT, "5 values for 48 elements");
    build_mlp(&b);
    b.g.initializer[1]->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__STRING;
    expect_load_error(&b, EM_ERR_UNSUPPORTED, "element type STRING");
    build_mlp(&b);
    b.g.initializer[1]->dims[0] = -4;
    expect_load_error(&b, EM_ERR_FORMAT, "dim 0 is -4");
    build_mlp(&b);
    b.g.input[0]->type->tensor_type->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64;
    expect_load_error(&b, EM_ERR_UNSUPPORTED, "graph input 'x' has element type COMPLEX64");
}

static void test_run_errors(void **state)
{
    (void)state;
    model_b b;
    build_mlp(&b);
    size_t n;
    uint8_t *bytes = mb_pack(&b, &n);
    em_onnx_model *m = load_bytes(bytes, n, NULL);
    assert_non_null(m);
    em_tensor *y = NULL;
    em_tensor *xi = em_zeros((int64_t[]){2, 2, 3}, 3, EM_I64);
    assert_int_equal(em_onnx_run(m, &xi, 1, &y, 1), EM_ERR_DTYPE);
    if (!strstr(em_last_error(), "input 'x' is int64, the model declares FLOAT")) fail_msg("%s", em_last_error());
    em_tensor *xs = em_zeros((int64_t[]){2, 3, 3}, 3, EM_F32);
    assert_int_equal(em_onnx_run(m, &xs, 1, &y, 1), EM_ERR_SHAPE);
    assert_non_null(strstr(em_last_error(), "input 'x' has shape [2, 3, 3]"));
    assert_int_equal(em_onnx_run(m, &xs, 2, &y, 1), EM_ERR_INVALID);
    assert_null(y);
    em_tensor_release(xi);
    em_tensor_release(xs);
    em_onnx_free(m);
    free(bytes);
    /* a node failing at run time names itself */
    build_mlp(&b);
    b.g.initializer[2]->dims[1] = 4; /* fc2.weight [3, 4]: Gemm's inner dims disagree */
    b.g.initializer[2]->n_float_data = 12;
    bytes = mb_pack(&b, &n);
    m = load_bytes(bytes, n, NULL);
    assert_non_null(m);
    em_tensor *x = em_zeros((int64_t[]){2, 2, 3}, 3, EM_F32);
    em_no_grad_begin();
    assert_true(em_onnx_run(m, &x, 1, &y, 1) != EM_OK);
    em_no_grad_end();
    assert_non_null(strstr(em_last_error(), "node 'fc2' (Gemm, opset 17)"));
    assert_null(y);
    em_tensor_release(x);
    em_onnx_free(m);
    free(bytes);
    const char *err = NULL;
    assert_null(em_onnx_load(em_test_tmp_path("nope.onnx"), &err));
    assert_non_null(strstr(err, "nope.onnx"));
    assert_null(em_onnx_read_tensor(em_test_tmp_path("nope.pb"), NULL));
}

static void test_npy(void **state)
{
    (void)state;
    float v[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    em_tensor *t = em_from_host(v, (int64_t[]){2, 3}, 2, EM_F32);
    const char *p = em_test_tmp_path("a.npy");
    assert_int_equal(em_npy_save(p, t), EM_OK);
    em_tensor *r = em_npy_load(p);
    assert_non_null(r);
    em_test_assert_shape(r, 2, (int64_t[]){2, 3});
    double *g = em_test_values(r);
    for (int i = 0; i < 6; i++) assert_true(g[i] == v[i]);
    free(g);
    /* the header numpy would write, padded to 64 bytes */
    FILE *f = fopen(p, "rb");
    char hdr[128];
    assert_int_equal(fread(hdr, 1, 128, f), 128);
    fclose(f);
    assert_memory_equal(hdr + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 59);
    assert_int_equal(hdr[127], '\n');
    /* bad files */
    const char *q = em_test_tmp_path("bad.npy");
    f = fopen(q, "wb");
    fputs("not numpy", f);
    fclose(f);
    assert_null(em_npy_load(q));
    assert_non_null(strstr(em_last_error(), "not a .npy file"));
    f = fopen(q, "wb");
    fwrite(hdr, 1, 128, f);
    fwrite(v, 4, 5, f); /* one value short */
    fclose(f);
    assert_null(em_npy_load(q));
    assert_non_null(strstr(em_last_error(), "need 24"));
    memcpy(hdr + 21, "<c8", 3);
    f = fopen(q, "wb");
    fwrite(hdr, 1, 128, f);
    fclose(f);
    assert_null(em_npy_load(q));
    assert_non_null(strstr(em_last_error(), "'<c8' is not supported"));
    em_tensor_release(r);
    em_tensor_release(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_matches_reference),
        cmocka_unit_test(test_mlp_fine_tunes),
        cmocka_unit_test(test_truncated_and_corrupt),
        cmocka_unit_test(test_nesting_bomb),
        cmocka_unit_test(test_external_data),
        cmocka_unit_test(test_graph_errors),
        cmocka_unit_test(test_run_errors),
        cmocka_unit_test(test_npy),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
