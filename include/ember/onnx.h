/* Ember ONNX import: run an ONNX model's graph as Ember ops on any device.
 *
 *     em_init(NULL);                                  // the runtime first
 *     const char *err = NULL;
 *     em_onnx_model *m = em_onnx_load("model.onnx", &err);
 *     if (!m) { fprintf(stderr, "%s\n", err); return 1; }   // err: until the next error
 *     em_tensor *x = em_from_host(pixels, (int64_t[]){1, 1, 28, 28}, 4, EM_F32);
 *     em_tensor *y = NULL;
 *     em_no_grad_begin();
 *     em_status st = em_onnx_run(m, &x, 1, &y, 1);   // y: logits [1, 10], caller-owned
 *     em_no_grad_end();
 *     em_tensor_release(y); em_tensor_release(x); em_onnx_free(m);
 *
 * What is read: ModelProto of IR versions 3 and later, operator sets 7 to 28
 * of the default domain ("" / "ai.onnx"), tensors inline or as external data
 * (a path relative to the model's folder, never outside it). The graph is
 * checked at load: every node's operator must be one Ember implements at the
 * model's opset (else EM_ERR_UNSUPPORTED naming the node, the operator and
 * the opset), every input must be produced before it is used (a cycle or an
 * undefined name is EM_ERR_FORMAT), element types must be ones Ember holds.
 * Attributes are checked when the node first runs.
 *
 * Element types: FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT32, INT64, UINT8 and
 * BOOL map to the Ember dtype of the same name. INT8, INT16, UINT16 and the
 * packed INT4, UINT4, INT2, UINT2 are held as EM_I32 and UINT32 as EM_I64;
 * the 8-bit floats (FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ,
 * FLOAT8E8M0) and FLOAT4E2M1 as EM_F32. Every value is exact in the wider
 * dtype, and operators keep results in the declared type's range or grid
 * (integer wrap-around, Cast's rounding and saturation); em_onnx_run hands
 * such outputs back in the wider dtype, and em_onnx_output_type gives the
 * declared ONNX type. STRING, UINT64, complex and the 6-bit floats are
 * EM_ERR_UNSUPPORTED.
 *
 * Parameters: every floating-point initializer becomes a parameter of the
 * module em_onnx_module returns (requires_grad; its key is the initializer's
 * name, dots making child modules as in PyTorch's keys); the others become
 * buffers. The graph uses those very tensors, so an optimizer stepping the
 * module's parameters fine-tunes the imported model; run under
 * em_no_grad_begin() for inference.
 *
 * Ownership: the model owns its initializers, module and graph; em_onnx_free
 * releases them. Errors: NULL / negative em_status with em_last_error(),
 * never an abort.
 */
#ifndef EMBER_ONNX_H
#define EMBER_ONNX_H

#include "ember/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_onnx_model em_onnx_model;

/** Loads the ONNX file @p path. NULL on error; then, when @p err is not
 *  NULL, *err points at the message (em_last_error(): valid until the
 *  thread's next error). */
EM_API em_onnx_model *em_onnx_load(const char *path, const char **err);
/** Loads a model from @p n bytes at @p data (copied as needed; @p data may
 *  be freed after). External data is looked up under @p base_dir (NULL:
 *  external data is an error). @p name names the model in messages. */
EM_API em_onnx_model *em_onnx_load_memory(const void *data, size_t n, const char *base_dir, const char *name,
                                          const char **err);
/** Frees the model (NULL: no-op). Tensors em_onnx_run returned stay valid. */
EM_API void em_onnx_free(em_onnx_model *m);

/** The graph's inputs, initializers excluded, in declaration order. */
EM_API int em_onnx_num_inputs(const em_onnx_model *m);
EM_API const char *em_onnx_input_name(const em_onnx_model *m, int i);
/** Declared shape of input @p i: writes up to EM_MAX_DIMS dims into @p shape
 *  (-1 for a symbolic or missing dim) and returns the rank, or -1 when the
 *  model declares no shape. */
EM_API int em_onnx_input_shape(const em_onnx_model *m, int i, int64_t *shape);
/** Ember dtype of input @p i (the dtype em_onnx_run expects). */
EM_API em_dtype em_onnx_input_dtype(const em_onnx_model *m, int i);
EM_API int em_onnx_num_outputs(const em_onnx_model *m);
EM_API const char *em_onnx_output_name(const em_onnx_model *m, int i);
/** Declared ONNX element type of output @p i (TensorProto.DataType number:
 *  1 FLOAT, 7 INT64, ...); 0 when undeclared. */
EM_API int em_onnx_output_type(const em_onnx_model *m, int i);
/** Name of an ONNX element type number ("FLOAT", "INT8", ...; "?" if unknown). */
EM_API const char *em_onnx_type_name(int onnx_type);
/** The model's opset of the default domain. */
EM_API int em_onnx_opset(const em_onnx_model *m);

/** Runs the graph. @p inputs: @p nin tensors in em_onnx_input_name order
 *  (borrowed; NULL only for an input the graph does not use). Writes
 *  @p nout new references (owned by the caller, whatever scope is open)
 *  into @p outputs, in output order; @p nout may be fewer than the graph's
 *  outputs. Errors name the node ("node 'conv1' (Conv, opset 17): ...");
 *  on error no output is written. Thread-safe for one model only from one
 *  thread at a time. */
EM_API em_status em_onnx_run(em_onnx_model *m, em_tensor *const inputs[], int nin, em_tensor *outputs[], int nout);

/** The module holding the initializers (borrowed; owned by @p m). Its
 *  forward runs the graph for a model of one input and one output. */
EM_API em_module *em_onnx_module(em_onnx_model *m);
/** Number of initializers, and the i-th one's ONNX name and tensor (borrowed). */
EM_API int em_onnx_num_initializers(const em_onnx_model *m);
EM_API const char *em_onnx_initializer_name(const em_onnx_model *m, int i);
EM_API em_tensor *em_onnx_initializer(const em_onnx_model *m, int i);

/** Reads one serialized TensorProto (the node tests' input_N.pb files).
 *  Returns a new reference and its ONNX element type in *onnx_type (may be
 *  NULL); NULL + error on a bad file. */
EM_API em_tensor *em_onnx_read_tensor(const char *path, int *onnx_type);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_ONNX_H */
