/* ONNX import internals (store/onnx_*.c): the loaded graph, the operator
 * table and the helpers operator implementations use.
 *
 * An operator is one entry of an onnx_op table: its op_type, the oldest
 * opset it is implemented for, and a function run once per node execution.
 * The function reads its inputs and attributes through the onnx_* helpers
 * below and sets its outputs with onnx_out; it runs inside a scope of its
 * own (tensors it makes and does not hand out are released after it), and
 * reports errors with em_set_error (the caller prefixes the node's name,
 * operator and opset). EM_ERR_UNSUPPORTED (onnx_unsupported) marks an
 * attribute value, input combination or dtype Ember does not implement, as
 * opposed to a wrong model.
 *
 * Tables: onnx_ops_core (store/onnx_ops.c) and one per group of operators
 * (onnx_ops_control, store/onnx_ops_control.c: If, Loop, Scan);
 * onnx_find_op searches them in order.
 */
#ifndef EMBER_STORE_ONNX_INTERNAL_H
#define EMBER_STORE_ONNX_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ember/autograd.h"
#include "ember/core.h"
#include "ember/nn.h"
#include "ember/onnx.h"
#include "ember/tensor.h"
#include "onnx.pb-c.h"

/* TensorProto.DataType numbers. */
enum {
    ONNX_UNDEFINED = 0, ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT8 = 3, ONNX_UINT16 = 4, ONNX_INT16 = 5,
    ONNX_INT32 = 6, ONNX_INT64 = 7, ONNX_STRING = 8, ONNX_BOOL = 9, ONNX_FLOAT16 = 10, ONNX_DOUBLE = 11,
    ONNX_UINT32 = 12, ONNX_UINT64 = 13, ONNX_BFLOAT16 = 16,
    ONNX_FLOAT8E4M3FN = 17, ONNX_FLOAT8E4M3FNUZ = 18, ONNX_FLOAT8E5M2 = 19, ONNX_FLOAT8E5M2FNUZ = 20, ONNX_UINT4 = 21, ONNX_INT4 = 22,
    ONNX_FLOAT4E2M1 = 23, ONNX_FLOAT8E8M0 = 24, ONNX_UINT2 = 25, ONNX_INT2 = 26,
};

/** One value of a run: a tensor (owned reference) and its ONNX element type. */
typedef struct onnx_value {
    em_tensor *t;
    int type;
} onnx_value;

typedef struct onnx_ctx onnx_ctx;
/** A loaded graph (the main graph or a subgraph); opaque outside the loader. */
typedef struct onnx_graph onnx_graph;
typedef em_status (*onnx_op_fn)(onnx_ctx *c);

typedef struct onnx_op {
    const char *name;  /**< op_type, e.g. "Conv" */
    int since;         /**< oldest opset of the default domain it implements */
    onnx_op_fn fn;
} onnx_op;

/** A node of the loaded graph. */
typedef struct onnx_node {
    const Onnx__NodeProto *p;  /**< name, op_type, attributes (owned by the model's proto) */
    const onnx_op *op;
    int opset;                 /**< the model's version of the node's domain */
    int nin, nout;
    int *in, *out;             /**< value ids; -1 = omitted optional input/output */
    int nimpl, *impl;          /**< values of this graph its subgraphs read (kept alive until it has run) */
    onnx_graph **sub;          /**< per attribute of p: the loaded graph of a GRAPH attribute, else NULL; NULL: none */
} onnx_node;

/** What an operator function sees. */
struct onnx_ctx {
    em_onnx_model *model;
    const onnx_node *node;
    int opset;                 /**< = node->opset */
    int nin;
    const onnx_value *in;      /**< in[i].t is NULL for an omitted input */
    int nout;
    onnx_value *out;           /**< set through onnx_out */
    const onnx_graph *graph;   /**< the graph the node belongs to */
    onnx_value *values;        /**< that graph's values in this run (read by subgraphs; loader only) */
};

/* ---- inputs ---- */
/** Input @p i (borrowed) or NULL when omitted / past the node's inputs. */
em_tensor *onnx_in(onnx_ctx *c, int i);
/** ONNX element type of input @p i (0 when omitted). */
int onnx_in_type(onnx_ctx *c, int i);
/** Input @p i, required: NULL + error naming it when omitted. */
em_tensor *onnx_in_req(onnx_ctx *c, int i);
/** Reads integer input @p i (any int dtype, rank <= 1) to the host into
 *  @p buf (up to @p max values). Returns the count, -1 + error. */
int onnx_in_ints(onnx_ctx *c, int i, int64_t *buf, int max);
/** Reads scalar (one-element) input @p i as a double. */
em_status onnx_in_scalar(onnx_ctx *c, int i, double *v);

/* ---- attributes ---- */
const Onnx__AttributeProto *onnx_attr(onnx_ctx *c, const char *name);
bool onnx_has_attr(onnx_ctx *c, const char *name);
int64_t onnx_attr_int(onnx_ctx *c, const char *name, int64_t def);
double onnx_attr_float(onnx_ctx *c, const char *name, double def);
/** String attribute (NUL-terminated copy owned by the model) or @p def. */
const char *onnx_attr_string(onnx_ctx *c, const char *name, const char *def);
/** INTS attribute: pointer to the values in *v, returns the count (-1 when absent). */
int onnx_attr_ints(onnx_ctx *c, const char *name, const int64_t **v);
int onnx_attr_floats(onnx_ctx *c, const char *name, const float **v);
/** TENSOR attribute converted to a tensor (new reference in the op's scope);
 *  NULL when absent (no error set) or bad (error set: check em_last_status). */
em_tensor *onnx_attr_tensor(onnx_ctx *c, const char *name, int *type);

/* ---- outputs ---- */
/** Sets output @p i to @p t (a reference in the op's scope, kept by the
 *  run); its ONNX type is @p type, or derived (0): input 0's when the Ember
 *  dtypes agree, else the type of t's dtype. NULL @p t returns the pending
 *  error. Output slots past the node's outputs are ignored. */
em_status onnx_out(onnx_ctx *c, int i, em_tensor *t, int type);

/* ---- subgraphs (GRAPH attributes: If, Loop, Scan) ---- */
/** Runs the node's subgraph in attribute @p attr_name once: @p nin input
 *  values (borrowed; exactly the subgraph's input count) give the
 *  subgraph's inputs in order; names the subgraph does not define are the
 *  enclosing graphs' values. Its first @p nout outputs are set in @p out as
 *  tensors in the current (the op's) scope with their ONNX types. Errors
 *  name the failing node inside the subgraph. */
em_status onnx_run_subgraph(onnx_ctx *c, const char *attr_name, int nin, const onnx_value *in, int nout, onnx_value *out);
/** Input and output counts of the subgraph in attribute @p attr_name
 *  (error when the node has no such GRAPH attribute). */
em_status onnx_subgraph_arity(onnx_ctx *c, const char *attr_name, int *nin, int *nout);

/* ---- errors and small helpers ---- */
/** EM_ERR_UNSUPPORTED with the message. */
em_status onnx_unsupported(onnx_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Normalises @p axis (negative counts from the end) for rank @p rank;
 *  error naming the attribute when out of range. */
em_status onnx_axis(onnx_ctx *c, int64_t axis, int rank, int *out);

/** Ember dtype holding ONNX type @p t; false when Ember has none. */
bool onnx_type_to_dtype(int t, em_dtype *out);
/** ONNX type of an Ember dtype. */
int onnx_type_of_dtype(em_dtype dt);
/** Converts a TensorProto to a tensor (new reference, caller-owned rules of
 *  tensor.h); external data is read under @p base_dir. */
em_tensor *onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *base_dir, int *type);

/** The value range of integer ONNX type @p type (INT2 to INT64, UINT2 to
 *  UINT32, BOOL) into *lo, *hi; false (nothing written) for other types. */
bool onnx_int_range(int type, double *lo, double *hi);

/** Wraps integer values of widened types back into their range
 *  (INT8 / INT16 / UINT16 in EM_I32, UINT32 in EM_I64), as a C cast does:
 *  a new tensor in the current scope; other types: @p t itself. */
em_tensor *onnx_wrap_int(em_tensor *t, int type);

/* Operator tables, each terminated by {NULL, 0, NULL}. */
extern const onnx_op onnx_ops_core[];
extern const onnx_op onnx_ops_elementwise[];
extern const onnx_op onnx_ops_shape[];
extern const onnx_op onnx_ops_nn[];
extern const onnx_op onnx_ops_vision[];
extern const onnx_op onnx_ops_rnn[];
extern const onnx_op onnx_ops_control[];
/** The entry for @p op_type (default domain) at @p opset, or NULL. */
const onnx_op *onnx_find_op(const char *op_type, int opset);

#endif
