/* Ember tensors and tensor operations.
 *
 * Ownership: every function that returns an em_tensor* returns a NEW reference.
 * Inside em_scope_begin()/em_scope_end() the scope owns it (released at the end
 * unless em_keep() moved it out); outside any scope the caller owns it and
 * calls em_tensor_release(). Input tensors are borrowed, never consumed.
 *
 * Errors: ops return NULL and set em_last_error(); a NULL input makes an op
 * return NULL (so a chain of ops fails once, cleanly); when the pending
 * error is an out-of-memory, device or runtime failure (EM_ERR_NOMEM,
 * EM_ERR_DEVICE, EM_ERR_RUNTIME) it is kept, so em_last_error names the cause
 * of the chain's failure, else the op reports EM_ERR_INVALID "input is NULL".
 *
 * Dims: a negative dim counts from the end (-1 = last), as in PyTorch.
 * Broadcasting: NumPy/PyTorch rules (align trailing dims, size 1 stretches).
 * Dtype promotion (binary ops): bool < u8 < i32 < i64 < f32 < f64; an int
 * tensor combined with a float scalar becomes f32 (PyTorch's default dtype).
 *
 * Every op becomes one or more StarPU tasks; nothing waits unless a result is
 * read on the host (em_to_host, em_item, em_tensor_print).
 */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include "ember/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_tensor em_tensor;

/* ---- object, ownership, scopes ------------------------------------------ */

EM_API em_tensor *em_tensor_retain(em_tensor *t);
/** Drops one reference; NULL is a no-op. Pending tasks using the data are safe. */
EM_API void em_tensor_release(em_tensor *t);
/** Opens a scope (nestable, per thread). */
EM_API void em_scope_begin(void);
/** Releases every tensor the innermost scope owns. */
EM_API void em_scope_end(void);
/** Frees the calling thread's own state (its scope stack; scopes still open
 *  are ended first). Call it last in a thread of yours that used Ember and
 *  ends before the process does (the threads of em_replicas_run do it
 *  themselves); without it each such thread leaves its stack behind. */
EM_API void em_thread_exit(void);
/** Moves @p t from the innermost scope to the enclosing one (or to the caller
 *  when there is none). Returns t. */
EM_API em_tensor *em_keep(em_tensor *t);

EM_API em_dtype em_tensor_dtype(const em_tensor *t);
EM_API int em_tensor_ndim(const em_tensor *t);
/** Pointer to ndim sizes (valid while t lives). */
EM_API const int64_t *em_tensor_shape(const em_tensor *t);
/** Size of dim @p d (negative counts from the end); -1 on bad dim. */
EM_API int64_t em_tensor_dim(const em_tensor *t, int d);
/** Strides in elements. */
EM_API const int64_t *em_tensor_strides(const em_tensor *t);
EM_API int64_t em_tensor_offset(const em_tensor *t);
EM_API int64_t em_tensor_numel(const em_tensor *t);
EM_API bool em_tensor_is_contiguous(const em_tensor *t);
/** true when a and b share one storage (views). */
EM_API bool em_tensor_shares_storage(const em_tensor *a, const em_tensor *b);
/** Formats a shape as "[2, 3]" into buf. */
EM_API const char *em_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);

/* ---- creation ------------------------------------------------------------ */

EM_API em_tensor *em_empty(const int64_t *shape, int ndim, em_dtype dt);
EM_API em_tensor *em_zeros(const int64_t *shape, int ndim, em_dtype dt);
EM_API em_tensor *em_ones(const int64_t *shape, int ndim, em_dtype dt);
EM_API em_tensor *em_full(const int64_t *shape, int ndim, em_dtype dt, double value);
EM_API em_tensor *em_zeros_like(const em_tensor *t);
EM_API em_tensor *em_ones_like(const em_tensor *t);
EM_API em_tensor *em_full_like(const em_tensor *t, double value);
/** 0-d tensor holding @p value. */
EM_API em_tensor *em_scalar(double value, em_dtype dt);
/** [start, end) with @p step, as torch.arange. */
EM_API em_tensor *em_arange(double start, double end, double step, em_dtype dt);
/** @p steps evenly spaced values from start to end inclusive, as torch.linspace. */
EM_API em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt);
/** n x m identity (m <= 0 means m = n). */
EM_API em_tensor *em_eye(int64_t n, int64_t m, em_dtype dt);
/** Copies numel * em_dtype_size(dt) bytes from @p data (C order). */
EM_API em_tensor *em_from_host(const void *data, const int64_t *shape, int ndim, em_dtype dt);

/* Random numbers: a Philox4x32-10 counter-based generator. Element i of a
 * draw uses counter (offset + i) under key = seed, so the same seed gives the
 * same numbers whatever the device or the tiling. The global generator's
 * offset advances by the draw's size after each call (as torch.manual_seed). */
EM_API void em_manual_seed(uint64_t seed);
/** Current global generator state (for checkpoints). */
EM_API void em_rng_get_state(uint64_t *seed, uint64_t *offset);
EM_API void em_rng_set_state(uint64_t seed, uint64_t offset);
/** U[low, high). Float dtypes only. */
EM_API em_tensor *em_rand_uniform(const int64_t *shape, int ndim, em_dtype dt, double low, double high);
/** N(mean, std^2) by Box-Muller. Float dtypes only. */
EM_API em_tensor *em_rand_normal(const int64_t *shape, int ndim, em_dtype dt, double mean, double std);
/** 1 with probability p, else 0. */
EM_API em_tensor *em_rand_bernoulli(const int64_t *shape, int ndim, em_dtype dt, double p);

/* ---- host I/O ------------------------------------------------------------ */

/** Waits for @p t and copies its elements in C order into @p dst, which holds
 *  @p nbytes (must be >= numel * dtype size). When a kernel has failed since
 *  the last report (see em_sync) it returns that error instead (the values
 *  copied are then undefined) and clears it. */
EM_API em_status em_to_host(const em_tensor *t, void *dst, size_t nbytes);
/** Value of a one-element tensor, converted to double. Reports a kernel
 *  failure as em_to_host does. */
EM_API em_status em_item(const em_tensor *t, double *out);
/** Prints like PyTorch: "tensor([[1., 2.],\n        [3., 4.]])". */
EM_API em_status em_tensor_print(const em_tensor *t, FILE *f);
/** Same text in a malloc'd string (caller frees); NULL on error. */
EM_API char *em_tensor_to_string(const em_tensor *t);

/* ---- element-wise unary ------------------------------------------------- */
/* Integer inputs of float-only functions (exp, log, sigmoid, ...) are promoted
 * to f32 first, as in PyTorch. */

EM_API em_tensor *em_neg(const em_tensor *a);
EM_API em_tensor *em_abs(const em_tensor *a);
EM_API em_tensor *em_sign(const em_tensor *a);
EM_API em_tensor *em_exp(const em_tensor *a);
EM_API em_tensor *em_log(const em_tensor *a);
EM_API em_tensor *em_log1p(const em_tensor *a);
EM_API em_tensor *em_sqrt(const em_tensor *a);
EM_API em_tensor *em_rsqrt(const em_tensor *a);
EM_API em_tensor *em_reciprocal(const em_tensor *a);
EM_API em_tensor *em_square(const em_tensor *a);
EM_API em_tensor *em_sin(const em_tensor *a);
EM_API em_tensor *em_cos(const em_tensor *a);
EM_API em_tensor *em_tanh(const em_tensor *a);
EM_API em_tensor *em_sigmoid(const em_tensor *a);
EM_API em_tensor *em_relu(const em_tensor *a);
/** GELU, exact erf form: x * Phi(x) (Hendrycks & Gimpel 2016). */
EM_API em_tensor *em_gelu(const em_tensor *a);
/** GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). */
EM_API em_tensor *em_gelu_tanh(const em_tensor *a);
/** SiLU / swish: x * sigmoid(x). */
EM_API em_tensor *em_silu(const em_tensor *a);
/** softplus(x) = log(1 + exp(x)) computed stably. */
EM_API em_tensor *em_softplus(const em_tensor *a);
EM_API em_tensor *em_erf(const em_tensor *a);
EM_API em_tensor *em_floor(const em_tensor *a);
EM_API em_tensor *em_ceil(const em_tensor *a);
/** Round half to even, as torch.round. */
EM_API em_tensor *em_round(const em_tensor *a);
/** min(max(x, lo), hi); pass -INFINITY / INFINITY for one-sided. */
EM_API em_tensor *em_clamp(const em_tensor *a, double lo, double hi);
EM_API em_tensor *em_pow_scalar(const em_tensor *a, double exponent);
/** LeakyReLU: x if x >= 0 else slope * x. */
EM_API em_tensor *em_leaky_relu(const em_tensor *a, double negative_slope);
/** ELU: x if x > 0 else alpha * (exp(x) - 1). */
EM_API em_tensor *em_elu(const em_tensor *a, double alpha);
/** Hardswish: x * relu6(x + 3) / 6 (Howard et al. 2019, torch.nn.Hardswish). */
EM_API em_tensor *em_hardswish(const em_tensor *a);
/** Hardsigmoid: relu6(x + 3) / 6 (torch.nn.Hardsigmoid). */
EM_API em_tensor *em_hardsigmoid(const em_tensor *a);
/** Mish: x * tanh(softplus(x)) (Misra 2019; softplus threshold 20 as PyTorch). */
EM_API em_tensor *em_mish(const em_tensor *a);
/** SELU: scale * (x if x > 0 else alpha * (exp(x) - 1)) with alpha =
 *  1.6732632423543772, scale = 1.0507009873554805 (Klambauer et al. 2017). */
EM_API em_tensor *em_selu(const em_tensor *a);
/** CELU: x if x > 0 else alpha * (exp(x / alpha) - 1) (Barron 2017,
 *  torch.nn.CELU; PyTorch's default alpha is 1). EM_ERR_INVALID when alpha is
 *  0 or not finite. */
EM_API em_tensor *em_celu(const em_tensor *a, double alpha);
/** Softsign: x / (1 + |x|). */
EM_API em_tensor *em_softsign(const em_tensor *a);
/** log(sigmoid(x)), computed stably as min(x, 0) - log1p(exp(-|x|)). */
EM_API em_tensor *em_logsigmoid(const em_tensor *a);
/** exp(x) - 1, accurate near 0. */
EM_API em_tensor *em_expm1(const em_tensor *a);
/** Base-2 logarithm. */
EM_API em_tensor *em_log2(const em_tensor *a);
/** 2 ** x. */
EM_API em_tensor *em_exp2(const em_tensor *a);
/** Rounds towards zero; integer tensors are returned unchanged (a copy). */
EM_API em_tensor *em_trunc(const em_tensor *a);
/** Inverse error function on [-1, 1]: +-inf at +-1, nan outside (torch.erfinv). */
EM_API em_tensor *em_erfinv(const em_tensor *a);

/* ---- element-wise binary (broadcasting) ---------------------------------- */

EM_API em_tensor *em_add(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_sub(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_mul(const em_tensor *a, const em_tensor *b);
/** True division: integer inputs give f32, as torch.div. */
EM_API em_tensor *em_div(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_pow(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_maximum(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_minimum(const em_tensor *a, const em_tensor *b);
/* remainder, fmod, floor_divide: integer inputs stay integer. An integer
 * division by zero is, on the CPU, the sticky kernel error EM_ERR_INVALID
 * (reported by the next em_sync / em_to_host / em_item; PyTorch raises), and
 * gives 0 on CUDA and OpenCL (not reported). Two bool inputs are an
 * EM_ERR_DTYPE error, as PyTorch. */
/** Python-style remainder (sign of the divisor), as torch.remainder. */
EM_API em_tensor *em_remainder(const em_tensor *a, const em_tensor *b);
/** C-style remainder (sign of the dividend), as torch.fmod. */
EM_API em_tensor *em_fmod(const em_tensor *a, const em_tensor *b);
/** Python's a // b: the floor of the quotient, for integers and floats, as
 *  torch.floor_divide; floats follow Python's float floor division (b = 0
 *  gives +-inf or nan). Its gradient is zero, as torch.div with
 *  rounding_mode="floor". */
EM_API em_tensor *em_floor_divide(const em_tensor *a, const em_tensor *b);
/** atan2(a, b): the angle of the point (b, a) in radians, in [-pi, pi];
 *  integer inputs give f32, as torch.atan2. */
EM_API em_tensor *em_atan2(const em_tensor *a, const em_tensor *b);
/** ReLU's gradient: 0 where b <= 0, else a (torch.ops.aten.threshold_backward(a, b, 0));
 *  a NaN in b passes a through. Broadcasts and promotes as em_mul; not
 *  differentiable (the backward of relu calls it). */
EM_API em_tensor *em_threshold_backward(const em_tensor *a, const em_tensor *b);
/* comparisons -> EM_BOOL */
EM_API em_tensor *em_eq(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ne(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_lt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_le(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_gt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ge(const em_tensor *a, const em_tensor *b);
/* logical -> EM_BOOL (non-zero is true) */
EM_API em_tensor *em_logical_and(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_logical_or(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_logical_not(const em_tensor *a);
/** mask ? a : b, all three broadcast together. */
EM_API em_tensor *em_where(const em_tensor *mask, const em_tensor *a, const em_tensor *b);
/** a with @p value wherever mask is true (mask broadcasts to a). */
EM_API em_tensor *em_masked_fill(const em_tensor *a, const em_tensor *mask, double value);

/* scalar forms: the scalar takes a's dtype unless a is integer and s is not
 * integral (then f32) */
EM_API em_tensor *em_add_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_sub_scalar(const em_tensor *a, double s);
/** s - a */
EM_API em_tensor *em_rsub_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_mul_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_div_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_maximum_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_minimum_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_remainder_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_eq_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_ne_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_lt_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_le_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_gt_scalar(const em_tensor *a, double s);
EM_API em_tensor *em_ge_scalar(const em_tensor *a, double s);

/* ---- reductions ---------------------------------------------------------- */
/* dims: @p ndims dims to reduce (negative allowed, no repeats); ndims == 0
 * (dims may be NULL) reduces over all dims. keepdim keeps reduced dims as 1. */

EM_API em_tensor *em_sum(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_mean(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_prod(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_max(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_min(const em_tensor *a, const int *dims, int ndims, bool keepdim);
/** Index (i64) of the first maximum along @p dim. */
EM_API em_tensor *em_argmax(const em_tensor *a, int dim, bool keepdim);
EM_API em_tensor *em_argmin(const em_tensor *a, int dim, bool keepdim);
/** Variance with Bessel-style @p correction (1 = unbiased, as torch.var). */
EM_API em_tensor *em_var(const em_tensor *a, const int *dims, int ndims, double correction, bool keepdim);
EM_API em_tensor *em_std(const em_tensor *a, const int *dims, int ndims, double correction, bool keepdim);
/** log(sum(exp(x))) computed with the max subtracted. */
EM_API em_tensor *em_logsumexp(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_any(const em_tensor *a, const int *dims, int ndims, bool keepdim);
EM_API em_tensor *em_all(const em_tensor *a, const int *dims, int ndims, bool keepdim);
/** Sum over all elements (0-d). */
EM_API em_tensor *em_sum_all(const em_tensor *a);
EM_API em_tensor *em_mean_all(const em_tensor *a);

/** softmax along @p dim: exp(x - max) / sum(exp(x - max)). Float dtypes. */
EM_API em_tensor *em_softmax(const em_tensor *a, int dim);
/** log_softmax along @p dim: x - max - log(sum(exp(x - max))). */
EM_API em_tensor *em_log_softmax(const em_tensor *a, int dim);

/* ---- linear algebra ------------------------------------------------------ */

/** torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, batched with broadcast
 *  batch dims, 1-D operands promoted and the added dim removed. Transposed
 *  views are passed to BLAS without copies. Float dtypes use BLAS. */
EM_API em_tensor *em_matmul(const em_tensor *a, const em_tensor *b);

/* ---- layout -------------------------------------------------------------- */
/* Views (share storage, no task): reshape of a contiguous tensor, flatten,
 * squeeze, unsqueeze, transpose, permute, expand, slice, narrow, split,
 * chunk. The rest copy. */

/** One entry may be -1 (inferred). Copies only when a is not viewable. */
EM_API em_tensor *em_reshape(const em_tensor *a, const int64_t *shape, int ndim);
/** Flattens dims start..end (inclusive) into one. */
EM_API em_tensor *em_flatten(const em_tensor *a, int start_dim, int end_dim);
/** Removes dim @p dim if it has size 1 (else returns a view of a unchanged). */
EM_API em_tensor *em_squeeze(const em_tensor *a, int dim);
/** Removes every size-1 dim. */
EM_API em_tensor *em_squeeze_all(const em_tensor *a);
EM_API em_tensor *em_unsqueeze(const em_tensor *a, int dim);
EM_API em_tensor *em_transpose(const em_tensor *a, int dim0, int dim1);
EM_API em_tensor *em_permute(const em_tensor *a, const int *perm, int ndim);
/** Broadcasts size-1 dims (or prepends dims) to @p shape; -1 keeps a size. */
EM_API em_tensor *em_expand(const em_tensor *a, const int64_t *shape, int ndim);
/** A contiguous tensor with the same values (a new reference to a itself when already contiguous). */
EM_API em_tensor *em_contiguous(const em_tensor *a);
/** Elements start, start+step, ... < end along dim (Python slice; negative
 *  start/end count from the end and are clamped; step >= 1). */
EM_API em_tensor *em_slice(const em_tensor *a, int dim, int64_t start, int64_t end, int64_t step);
/** length elements from start along dim (torch.narrow). */
EM_API em_tensor *em_narrow(const em_tensor *a, int dim, int64_t start, int64_t length);
/** Concatenates n tensors (same dtype, same shape except along dim). */
EM_API em_tensor *em_cat(em_tensor *const *ts, int n, int dim);
/** Stacks n tensors of identical shape along a new dim. */
EM_API em_tensor *em_stack(em_tensor *const *ts, int n, int dim);
/** Splits into pieces of @p split_size along dim (last may be smaller).
 *  Writes up to @p max_out views to out; returns the count or a negative em_status. */
EM_API int em_split(const em_tensor *a, int64_t split_size, int dim, em_tensor **out, int max_out);
/** Splits into @p chunks pieces as torch.chunk; returns the count or < 0. */
EM_API int em_chunk(const em_tensor *a, int chunks, int dim, em_tensor **out, int max_out);
/* Indexing: index tensors are int64 or int32 (EM_ERR_DTYPE otherwise). An
 * index value outside [0, size of its dim) (or [0, num_classes)) is an
 * error on the CPU: the sticky kernel error EM_ERR_INVALID naming the op and
 * the value, reported by the next em_sync / em_to_host / em_item (the result
 * is not written). On CUDA and OpenCL it is not reported: it reads 0
 * (gather, index_select), is skipped (scatter, scatter_add) or gives an
 * all-zero row (one_hot); nothing is read or written out of bounds. */
/** out[i][j] = a[index[i][j]][j] (dim 0) etc.; index has a's rank, out
 *  index's shape and a's dtype. */
EM_API em_tensor *em_gather(const em_tensor *a, int dim, const em_tensor *index);
/** Copy of a with src values written at index along dim (torch.scatter);
 *  src has a's dtype (EM_ERR_DTYPE otherwise) and rank, index's shape <= src's. */
EM_API em_tensor *em_scatter(const em_tensor *a, int dim, const em_tensor *index, const em_tensor *src);
/** Copy of a with src values added at index along dim (torch.scatter_add);
 *  same rules as em_scatter. */
EM_API em_tensor *em_scatter_add(const em_tensor *a, int dim, const em_tensor *index, const em_tensor *src);
/** Rows (dim) of a picked by the 1-D (or 0-d) @p index. */
EM_API em_tensor *em_index_select(const em_tensor *a, int dim, const em_tensor *index);
/** Copy of @p self with the slices of @p src added at @p index along dim
 *  (torch.index_add, alpha 1): out = self; out.select(dim, index[j]) +=
 *  src.select(dim, j) for every j. self [.., V, ..], at least 1-D
 *  (EM_ERR_SHAPE otherwise), any dtype (f16 / bf16 are computed in f32 and
 *  rounded once, like the other indexing ops; bool adds as logical or);
 *  index 1-D [N] or 0-d (one element; more dims: EM_ERR_SHAPE), int64 or
 *  int32 (EM_ERR_DTYPE otherwise);
 *  src of self's dtype (EM_ERR_DTYPE otherwise) and rank, self's shape with
 *  dim of size N (EM_ERR_SHAPE otherwise, naming both shapes). Duplicate
 *  indices accumulate in ascending j on every device, so f32 / f64 results
 *  are the CPU's bits everywhere. Out-of-range values: as the other
 *  indexing ops (above: an error on the CPU, skipped on CUDA / OpenCL).
 *  Differentiable in self (the gradient) and src (index_select of it).
 *  NULL input, bad dim (EM_ERR_INVALID): NULL with the error set. */
EM_API em_tensor *em_index_add(const em_tensor *self, int dim, const em_tensor *index, const em_tensor *src);
/** One-hot encoding of integer @p index (any shape) -> shape + [num_classes], i64;
 *  num_classes >= 1 (EM_ERR_INVALID otherwise). */
EM_API em_tensor *em_one_hot(const em_tensor *index, int64_t num_classes);
/** Converts to @p dt (float->int truncates toward zero, as PyTorch). */
EM_API em_tensor *em_cast(const em_tensor *a, em_dtype dt);
/** Constant padding, torch.nn.functional.pad order: pads = {last_left,
 *  last_right, prev_left, prev_right, ...}, npads even and <= 2*ndim;
 *  negative pads crop. */
EM_API em_tensor *em_pad(const em_tensor *a, const int64_t *pads, int npads, double value);

/** Padding modes of em_pad_mode (torch.nn.functional.pad's mode). */
typedef enum em_pad_mode_kind {
    EM_PAD_CONSTANT = 0,  /**< value outside the input (em_pad) */
    EM_PAD_REFLECT = 1,   /**< mirror without repeating the edge: pad < size of the dim */
    EM_PAD_REPLICATE = 2, /**< repeat the edge element: the dim must be non-empty */
    EM_PAD_CIRCULAR = 3,  /**< wrap around: pad <= size of the dim */
} em_pad_mode_kind;
/** torch.nn.functional.pad(a, pads, mode, value): pads as em_pad (last dim
 *  first, pairs of left/right). Non-constant modes take 2, 4 or 6
 *  non-negative pads (the last 1 to 3 dims; PyTorch: 1-D to 3-D spatial
 *  padding) and ignore @p value; they are index_select gathers (output
 *  position q of a dim of size n reads p = q - left mapped as: reflect
 *  -p / 2(n-1)-p, replicate clamp(p, 0, n-1), circular p mod n), so
 *  gradients flow on every device. Errors (EM_ERR_INVALID: pad count,
 *  negative pads, unknown mode; EM_ERR_SHAPE: reflect pad >= the dim's size,
 *  circular pad > the dim's size, replicate of an empty dim) name the shape,
 *  the pads and the mode. */
EM_API em_tensor *em_pad_mode(const em_tensor *a, const int64_t *pads, int npads, em_pad_mode_kind mode, double value);

/* ---- convolution and pooling (NCHW) ----------------------------------------
 * Float tensors (f32/f64) in NCHW: x [N, C, H, W] (conv1d: [N, C, L]);
 * a batch dim is required (PyTorch also takes unbatched input: here it is
 * an EM_ERR_SHAPE error naming the shape). Output sizes follow PyTorch:
 *   out = floor((in + pad_begin + pad_end - dilation * (k - 1) - 1) / stride) + 1
 * (pooling with ceil_mode rounds up, and drops a last window that would
 * start in the end padding). Bad input — wrong rank, channels not divisible
 * by groups, a kernel larger than the padded input, a zero-size output,
 * mismatched weight or bias shapes — is EM_ERR_SHAPE / EM_ERR_INVALID with
 * a message naming the shapes and settings. Everything is differentiable
 * (em_backward) with respect to x, weight and bias. Modules: ember/nn.h. */

/** Settings of a convolution; (h, w) pairs (conv1d uses index 0 only).
 *  em_conv_opts_default() gives PyTorch's defaults. */
typedef struct em_conv_opts {
    int64_t stride[2];         /**< {1, 1}; > 0 */
    int64_t padding[2];        /**< {0, 0}: zeros added at both ends (top/bottom, left/right) */
    int64_t padding_end[2];    /**< {-1, -1} = same as padding; >= 0: the bottom/right padding
                                    instead (asymmetric padding, done as an explicit zero pad) */
    bool padding_same;         /**< padding='same' (stride must be 1): total d*(k-1), the odd one
                                    at the end, as PyTorch; overrides padding */
    int64_t dilation[2];       /**< {1, 1}; > 0 */
    int64_t groups;            /**< 1; in and out channels divisible by it (depthwise: groups = C) */
    int64_t output_padding[2]; /**< {0, 0}; conv_transpose only; < stride or < dilation */
} em_conv_opts;
EM_API em_conv_opts em_conv_opts_default(void);

/** torch.nn.functional.conv2d (cross-correlation): x [N, C, H, W], weight
 *  [O, C/groups, kH, kW], bias [O] or NULL -> [N, O, oH, oW]. o NULL = defaults. */
EM_API em_tensor *em_conv2d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *o);
/** torch.nn.functional.conv1d: x [N, C, L], weight [O, C/groups, k], bias [O] or
 *  NULL -> [N, O, oL] (a conv2d of height 1; o's index 0 entries apply). */
EM_API em_tensor *em_conv1d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *o);
/** torch.nn.functional.conv_transpose2d (the gradient of conv2d with respect
 *  to its input): x [N, Cin, H, W], weight [Cin, Cout/groups, kH, kW], bias
 *  [Cout] or NULL -> [N, Cout, oH, oW], oH = (H - 1) * stride - 2 * padding +
 *  dilation * (kH - 1) + output_padding + 1. padding_end and padding_same are
 *  not allowed here. */
EM_API em_tensor *em_conv_transpose2d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *o);

/** Settings of a 2-D pooling; (h, w) pairs. em_pool_opts_default(kh, kw)
 *  gives PyTorch's defaults for that kernel size (stride = kernel size). */
typedef struct em_pool_opts {
    int64_t kernel_size[2];   /**< > 0 */
    int64_t stride[2];        /**< kernel_size; > 0 */
    int64_t padding[2];       /**< {0, 0}; <= kernel_size / 2 (PyTorch's rule) */
    int64_t dilation[2];      /**< {1, 1}; max pooling only */
    bool ceil_mode;           /**< false */
    bool count_include_pad;   /**< true; avg pooling: padded zeros count in the divisor */
    int64_t divisor_override; /**< 0 = none; avg pooling: divide every window by it */
} em_pool_opts;
EM_API em_pool_opts em_pool_opts_default(int64_t kh, int64_t kw);

/** torch.nn.functional.max_pool2d: x [N, C, H, W] -> [N, C, oH, oW]. When
 *  @p indices is non-NULL it receives a new i64 tensor of the output's shape
 *  holding the flat index h * W + w of each maximum in its input plane
 *  (return_indices=True; owned like the result). NaN is a maximum (the
 *  last NaN of a window wins), as in PyTorch; ties keep the first element in
 *  row-major window order. */
EM_API em_tensor *em_max_pool2d(const em_tensor *x, const em_pool_opts *o, em_tensor **indices);
/** torch.nn.functional.avg_pool2d: mean over each window; the divisor is
 *  divisor_override, else the window's size clipped to the padded input
 *  (count_include_pad) or to the input. */
EM_API em_tensor *em_avg_pool2d(const em_tensor *x, const em_pool_opts *o);
/** torch.nn.functional.adaptive_avg_pool2d: output [N, C, oh, ow]; window i
 *  of a dim of size I covers [floor(i*I/o), ceil((i+1)*I/o)). */
EM_API em_tensor *em_adaptive_avg_pool2d(const em_tensor *x, int64_t oh, int64_t ow);
/** torch.nn.functional.adaptive_max_pool2d (windows as above; indices as
 *  em_max_pool2d). */
EM_API em_tensor *em_adaptive_max_pool2d(const em_tensor *x, int64_t oh, int64_t ow, em_tensor **indices);

/** Writes @p src (broadcast) into the view @p dst in place: the storage of
 *  dst changes, as torch.Tensor.copy_. Not differentiable. */
EM_API em_status em_copy_(em_tensor *dst, const em_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
