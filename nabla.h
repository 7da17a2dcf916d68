/* nabla.h: the whole public API of nabla, a tensor library in C11 with
 * reverse-mode automatic differentiation.
 *
 * Conventions used throughout (a function's comment says only what differs):
 * - Every function that makes a tensor returns a new tensor object owned by
 *   the current scope (see nb_scope_begin), or a persistent one when no scope
 *   is open; persistent tensors are freed with nb_free.
 * - A "borrowed" result (nb_grad, nb_params_get, ...) belongs to its owner (a
 *   leaf, a registry, an optimizer) and lives as long as it: never nb_free it.
 * - On failure a function returns NULL (or a negative int: int functions
 *   that succeed with 0 fail with -1) and sets a thread-local message,
 *   nb_last_error(), naming the function and the values; a void function
 *   reports only through that message. Out of memory is such a failure.
 *   A NULL input makes an op return NULL with "fn: input i is NULL" (i counts
 *   the tensor arguments from 0), followed by ", after an earlier error: "
 *   and the last message that was not about a NULL, so a whole computation
 *   can be checked once at the end and still names the first failure.
 * - A freed handle (after nb_free, or after its scope ended) passed to any
 *   function is an error, "fn: input i was freed (by nb_free) ...", never a
 *   read of freed memory, for handles freed within the last 16,384 tensor
 *   allocations (NB_HANDLE_WINDOW): destroyed tensor objects are held back
 *   that long before their memory is reused. Past the window a stale handle
 *   is undefined behaviour, as any dangling pointer in C.
 * - Shapes are written (d0, d1, ...); "..." stands for any leading dims.
 * - Negative dims count from the end (-1 is the last); a dim out of range is
 *   an error.
 * - Binary ops broadcast like NumPy/PyTorch; both operands must have the same
 *   dtype (no implicit promotion: use nb_to).
 * - Arithmetic ops take floating tensors (NB_F32, NB_F64); comparisons take any
 *   dtype but NB_BF16 and return NB_BOOL. NB_BF16 (bfloat16) is for storage and
 *   products: see nb_dtype and nb_autocast_begin.
 * - Views (nb_view, nb_transpose, ...) share storage with their base; writing
 *   through one (nb_copy_into) is visible through the other.
 * - An op records its backward rule when grad mode is on and an input
 *   requires grad; ops with an NB_I64 or NB_BOOL result record nothing.
 */
#ifndef NABLA_H
#define NABLA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NB_API __attribute__((visibility("default")))
#else
#define NB_API
#endif

#define NB_MAX_DIMS 8
/* Tensor allocations after which a freed handle's memory may be reused. */
#define NB_HANDLE_WINDOW 16384

/* The version of this header; nb_version() gives the library's, which can
 * differ when a program runs against another libnabla.so.0. */
#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 13
#define NB_VERSION_PATCH 0
#define NB_VERSION_STRING "0.13.0"
NB_API const char *nb_version(void); /* the library's, e.g. "0.11.0" (a static string) */
/* The vector instruction-set path the kernels take on this CPU, read once:
 * "amx", "avx512bf16", "avx512", "avx2" or "portable". The environment
 * variable NABLA_ISA (one of those names, any case) caps it, so that any
 * machine can run the paths below its best; another value is ignored and
 * said once on stderr ("nabla: NABLA_ISA=..."). Results are bitwise the same
 * for any thread count on a given path, and may differ between paths. */
NB_API const char *nb_cpu_isa(void);

/* NB_BF16 is bfloat16 (2 bytes: the top half of an f32): a storage and
 * product dtype. nb_to converts to and from it (round to nearest even, as
 * PyTorch), views, copies, nb_cat/nb_stack, nb_matmul (f32 accumulation) and
 * the I/O functions take it; every other op refuses it with a message naming
 * the op (convert with nb_to, or compute in f32 under nb_autocast_begin). */
typedef enum { NB_F32 = 0, NB_F64 = 1, NB_I64 = 2, NB_BOOL = 3, NB_BF16 = 4 } nb_dtype;

typedef struct nb_tensor nb_tensor; /* opaque */

/* A counter-based random stream: draw k of a call made at offset o is a pure
 * function of (seed, o + k), so results never depend on the thread count. */
typedef struct nb_rng {
    uint64_t seed;
    uint64_t offset; /* how many numbers were drawn so far */
} nb_rng;

/* NB_SHAPE(2, 3) expands to the (ndim, shape) argument pair: 2, (int64_t[]){2, 3} */
#define NB_SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
                      (const int64_t[]){__VA_ARGS__}

/* ---------------------------------------------------- creation and copying */
/* Shapes: 0 <= ndim <= 8, every size >= 0, numel must fit int64_t; any dtype
 * unless said. A bad shape or an unknown dtype is an error. */
NB_API nb_tensor *nb_empty(nb_dtype dtype, int ndim, const int64_t *shape); /* uninitialized */
/* Filled with 0, 1 or value (which must fit int64_t for NB_I64; != 0 for NB_BOOL). */
NB_API nb_tensor *nb_zeros(nb_dtype dtype, int ndim, const int64_t *shape);
NB_API nb_tensor *nb_ones(nb_dtype dtype, int ndim, const int64_t *shape);
NB_API nb_tensor *nb_full(nb_dtype dtype, int ndim, const int64_t *shape, double value);
/* Copies numel elements of C type float/double/int64_t/bool (row-major) from
 * data, which may be NULL only when numel is 0. */
NB_API nb_tensor *nb_from_data(nb_dtype dtype, int ndim, const int64_t *shape, const void *data);
NB_API nb_tensor *nb_scalar(nb_dtype dtype, double value);     /* 0-d tensor, value as nb_full */
NB_API nb_tensor *nb_arange(nb_dtype dtype, int64_t n); /* (n): 0, 1, ..., n-1; n >= 0, no bool */
/* Standard normal / uniform [0,1) tensors (dtype NB_F32 or NB_F64) drawn from
 * rng (NULL = the global generator), whose offset advances. Normal element i
 * is Box-Muller of draws offset + 2i, offset + 2i + 1 in double (libm's log,
 * cos, sqrt), rounded to the dtype: the same values on any thread count and
 * instruction set (f32 runs a vector path, checked to round as libm's value
 * would). */
NB_API nb_tensor *nb_randn(nb_dtype dtype, int ndim, const int64_t *shape, struct nb_rng *rng);
NB_API nb_tensor *nb_rand(nb_dtype dtype, int ndim, const int64_t *shape, struct nb_rng *rng);
/* (rows, cols) NB_BOOL, true on and below the diagonal: the causal keep-mask. */
NB_API nb_tensor *nb_tril_mask(int64_t rows, int64_t cols);
/* The floating dtype modules create parameters in (NB_F32 at start), for the
 * whole process. A dtype other than NB_F32/NB_F64 is an error (unchanged). */
NB_API void nb_set_default_dtype(nb_dtype dtype);
NB_API nb_dtype nb_default_dtype(void);
/* Writes src's values into dst (a tensor or a view), broadcasting src to dst's
 * shape and converting dtype. Not recorded by autograd: a graph that saved dst
 * then refuses backward (see nb_mark_modified). 0, or -1 when src does not
 * broadcast to dst or dst is an expanded view (overlapping elements). */
NB_API int nb_copy_into(nb_tensor *dst, const nb_tensor *src);

/* -------------------------------------------------------------- inspection */
/* A NULL t is an error: -1 for ndim and numel; NULL for shape and strides,
 * which are t's own arrays of ndim entries, valid while t lives. */
NB_API int nb_ndim(const nb_tensor *t);
NB_API const int64_t *nb_shape(const nb_tensor *t);
NB_API const int64_t *nb_strides(const nb_tensor *t); /* in elements */
NB_API int64_t nb_size(const nb_tensor *t, int dim);  /* one size; -1 on error (bad dim, 0-d) */
NB_API int64_t nb_numel(const nb_tensor *t);
NB_API nb_dtype nb_dtype_of(const nb_tensor *t);       /* NB_F32 and a message on NULL */
NB_API const char *nb_dtype_name(nb_dtype dtype); /* "f32", "f64", "i64", "bool" or "unknown" */
/* True when the elements lie in row-major order without gaps (strides of size-1
 * dims do not matter; an empty tensor always is); false on NULL. */
NB_API bool nb_is_contiguous(const nb_tensor *t);
/* Whether a and b have an element in common (numpy's shares_memory): views
 * of one storage whose elements meet. Exact for tensors of up to 2^22
 * elements each; larger ones count as sharing when their byte ranges meet.
 * Empty tensors share nothing. false on NULL (with a message). */
NB_API bool nb_shares_memory(const nb_tensor *a, const nb_tensor *b);
/* Pointer to the first element (storage + offset), NULL on NULL; the layout
 * is given by nb_strides. For reading and writing values outside of autograd. */
NB_API void *nb_data(nb_tensor *t);
/* Call after writing t's values through nb_data: a recorded graph that saved
 * t (or a view of its storage) then refuses to backpropagate through stale
 * values, as after nb_copy_into. */
NB_API void nb_mark_modified(nb_tensor *t);
/* How many times t's storage has been written in place: nb_copy_into,
 * nb_mark_modified, an optimizer step, a load (PyTorch's t._version). Views
 * share their storage's count. A cache of something made from t is stale
 * when it changed. 0 for NULL (with a message). */
NB_API uint64_t nb_write_version(const nb_tensor *t);
NB_API double nb_item(const nb_tensor *t);           /* one element -> double; NaN on error */
/* Writes t's numel values, row-major, into out (room for numel doubles); 0 or -1. */
NB_API int nb_copy_to_f64(const nb_tensor *t, double *out);
/* To stdout, in PyTorch's layout; NULL is ok; a freed t prints tensor(freed)
 * and sets the message. */
NB_API void nb_print(const nb_tensor *t);

/* --------------------------------------------------------- views and shape */
/* Any dtype; all differentiable. nb_view, nb_transpose, nb_permute, nb_unsqueeze,
 * nb_squeeze, nb_expand, nb_narrow and nb_select always return a view: a new
 * tensor object (current scope) sharing t's storage, no copy. */
/* A view: the same storage seen with other shape/strides. One size may be -1;
 * the element count must match. Fails when the strides cannot express the new
 * shape (e.g. after nb_transpose): use nb_reshape. */
NB_API nb_tensor *nb_view(nb_tensor *t, int ndim, const int64_t *shape);
/* As nb_view when the strides allow, else a contiguous copy. */
NB_API nb_tensor *nb_reshape(nb_tensor *t, int ndim, const int64_t *shape);
NB_API nb_tensor *nb_transpose(nb_tensor *t, int dim0, int dim1); /* swaps two dims */
/* Dim i of the result is dim dims[i] of t; dims is a permutation of t's ndim dims. */
NB_API nb_tensor *nb_permute(nb_tensor *t, int ndim, const int *dims);
/* Inserts a size-1 dim at dim (-(ndim+1)..ndim); fails on an 8-d t. */
NB_API nb_tensor *nb_unsqueeze(nb_tensor *t, int dim);
/* Removes dim if its size is 1; otherwise a view of t with the same shape. */
NB_API nb_tensor *nb_squeeze(nb_tensor *t, int dim);
/* Broadcast view (stride 0) to shape; -1 keeps a size; new dims go in front;
 * only size-1 dims of t can grow. */
NB_API nb_tensor *nb_expand(nb_tensor *t, int ndim, const int64_t *shape);
/* Elements start .. start+length-1 of dim (start may be negative); same ndim. */
NB_API nb_tensor *nb_narrow(nb_tensor *t, int dim, int64_t start, int64_t length);
NB_API nb_tensor *nb_select(nb_tensor *t, int dim, int64_t index); /* removes dim; index < 0 ok */
/* A row-major copy of t, or a view of t (new handle) when t is contiguous already. */
NB_API nb_tensor *nb_contiguous(nb_tensor *t);
/* Copies the n >= 1 tensors of list (one dtype, at least 1-d, the same shape
 * except in dim) one after another along dim. */
NB_API nb_tensor *nb_cat(nb_tensor *const *list, int n, int dim);
/* torch.stack: the n >= 1 tensors of list (one shape, one dtype) joined along
 * a new dim, dim in [-(ndim+1), ndim] of the inputs' ndim; differentiable. */
NB_API nb_tensor *nb_stack(nb_tensor *const *list, int n, int dim);
/* A copy converted to dtype (to NB_I64 truncates, to NB_BOOL tests != 0, to
 * NB_BF16 rounds to nearest even with NaN kept NaN and overflow to inf, f64
 * through f32 first, bit for bit PyTorch's .to(torch.bfloat16)), or a view of
 * t when dtype is t's; differentiable between f32, f64 and bf16. */
NB_API nb_tensor *nb_to(nb_tensor *t, nb_dtype dtype);

/* ------------------------------------------------- elementwise, broadcasting */
/* a + b, a - b, a * b, a / b: floating, one dtype, broadcast shape; x / 0 as IEEE. */
NB_API nb_tensor *nb_add(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_sub(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_mul(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_div(nb_tensor *a, nb_tensor *b);
/* Elementwise min(a, b), max(a, b) (torch.minimum, torch.maximum): floating,
 * one dtype, broadcast shape; NaN on either side gives NaN, and at a tie
 * (-0 against +0) a's value. The gradient goes to the chosen input, half to
 * each where a == b, and whole to both where either is NaN (PyTorch 1.13). */
NB_API nb_tensor *nb_minimum(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_maximum(nb_tensor *a, nb_tensor *b);
/* -t, e^t, ln t, sqrt t, tanh t, max(t, 0) (NaN and -0 stay): floating, t's shape;
 * IEEE results outside the domain (log of a negative is NaN). */
NB_API nb_tensor *nb_neg(nb_tensor *t);
NB_API nb_tensor *nb_exp(nb_tensor *t);
NB_API nb_tensor *nb_log(nb_tensor *t);
NB_API nb_tensor *nb_sqrt(nb_tensor *t);
NB_API nb_tensor *nb_tanh(nb_tensor *t);
NB_API nb_tensor *nb_relu(nb_tensor *t);
NB_API nb_tensor *nb_gelu(nb_tensor *t);          /* exact (erf) form, as torch's default */
/* t ^ exponent, t + value, t * value: floating, t's shape. */
NB_API nb_tensor *nb_pow_scalar(nb_tensor *t, double exponent);
NB_API nb_tensor *nb_add_scalar(nb_tensor *t, double value);
NB_API nb_tensor *nb_mul_scalar(nb_tensor *t, double value);
/* 1 / (1 + e^-t) (torch.sigmoid), t * sigmoid(t) (torch.nn.functional.silu):
 * floating, t's shape. */
NB_API nb_tensor *nb_sigmoid(nb_tensor *t);
NB_API nb_tensor *nb_silu(nb_tensor *t);
/* |t| (torch.abs): floating, t's shape; |-0| = +0, NaN stays. Its gradient is
 * sgn(t) * g, 0 at t = 0 and at NaN (as torch). */
NB_API nb_tensor *nb_abs(nb_tensor *t);
/* min(max(t, lo), hi) (torch.clamp(t, min=lo, max=hi)): floating, t's shape;
 * -INFINITY / INFINITY for no bound, NaN in t stays (also when lo > hi,
 * which gives hi elsewhere); the bounds are rounded to t's dtype. The gradient is g where
 * lo <= t <= hi, else 0. Error: a NaN bound. */
NB_API nb_tensor *nb_clamp(nb_tensor *t, double lo, double hi);
/* GELU's tanh approximation (torch's gelu(approximate="tanh"), GPT-2's):
 * 0.5 t (1 + tanh(sqrt(2/pi) (t + 0.044715 t^3))): floating, t's shape. */
NB_API nb_tensor *nb_gelu_tanh(nb_tensor *t);
/* sin t, cos t (torch.sin, torch.cos): floating, t's shape; libm's values in
 * f64, f32 within docs/numerics.md's tolerance of them. */
NB_API nb_tensor *nb_sin(nb_tensor *t);
NB_API nb_tensor *nb_cos(nb_tensor *t);
/* Comparisons (any dtype, same for both; broadcast shape) and logic (mask must
 * be NB_BOOL): NB_BOOL results, not differentiable. */
NB_API nb_tensor *nb_eq(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_ne(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_lt(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_gt(nb_tensor *a, nb_tensor *b);
NB_API nb_tensor *nb_logical_not(nb_tensor *mask);
/* cond ? a : b, all three broadcast; cond NB_BOOL, a and b of one (any) dtype;
 * differentiable in a and b when floating. */
NB_API nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b);

/* -------------------------------------------------------------- reductions */
/* Over dim, which is kept with size 1 when keepdim, else removed. A 0-d t
 * (dim 0 or -1) gives a view of t (nb_argmax: a 0-d zero). */
/* Sum / mean over dim; floating. */
NB_API nb_tensor *nb_sum(nb_tensor *t, int dim, bool keepdim);
NB_API nb_tensor *nb_mean(nb_tensor *t, int dim, bool keepdim);
/* Max values over dim (floating; a NaN counts as the max); the gradient goes
 * to the first maximal element. An empty dim is an error, as for nb_argmax. */
NB_API nb_tensor *nb_max(nb_tensor *t, int dim, bool keepdim);
NB_API nb_tensor *nb_argmax(nb_tensor *t, int dim, bool keepdim); /* any dtype; NB_I64, first max */
/* Min values over dim, as torch.min(t, dim, keepdim).values: floating; a NaN
 * counts as the min; the gradient goes to the first minimal element; an empty
 * dim is an error. */
NB_API nb_tensor *nb_min(nb_tensor *t, int dim, bool keepdim);
/* Sum / mean over several dims, as torch.sum / torch.mean(t, dim=(d0, ...),
 * keepdim): dims may be negative; a dim given twice is an error naming it;
 * ndims 0 (dims may be NULL) reduces every dim (torch's dim=None), and keepdim
 * then keeps them all as size 1. The mean of an empty reduction is NaN.
 * Floating; accumulated in double. */
NB_API nb_tensor *nb_sum_dims(nb_tensor *t, int ndims, const int *dims, bool keepdim);
NB_API nb_tensor *nb_mean_dims(nb_tensor *t, int ndims, const int *dims, bool keepdim);
/* Variance / standard deviation over dims (as nb_sum_dims; ndims 0 = all), as
 * torch.var / torch.std(t, dim, correction=c, keepdim): sum((x - mean)^2) /
 * max(0, N - correction), so 1 is Bessel's correction and 0 the population
 * variance; N - correction <= 0 gives inf (NaN when every deviation is 0, as
 * for N = 1 with correction 1, or N = 0), as torch. Two passes (mean, then
 * squared deviations), in double. The gradient is 2 (x - mean) / (N -
 * correction) g (unclamped, as torch), for std divided by 2 std (zero where
 * std is 0, as torch). A correction that is not finite is an error. */
NB_API nb_tensor *nb_var(nb_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim);
NB_API nb_tensor *nb_std(nb_tensor *t, int ndims, const int *dims, double correction,
                         bool keepdim);
/* Running sums along dim, as torch.cumsum (same shape; a 0-d t takes dim 0 or
 * -1): floating; accumulated sequentially in double and rounded per element,
 * as torch's CPU kernel does for f32. The gradient is the reverse cumsum. */
NB_API nb_tensor *nb_cumsum(nb_tensor *t, int dim);
/* torch.sort(t, dim, descending, stable=True): floating t sorted along dim;
 * the indices (NB_I64, t's shape, in the current scope, the caller's to free)
 * go to *indices unless indices is NULL. Stable: equal values keep their
 * index order, in both directions. NaN sorts as the largest value (first
 * when descending), -0.0 and +0.0 are equal (so keep their order). A 0-d t
 * (dim 0 or -1) gives its value and index 0. Differentiable: the gradient
 * goes back to each value's original position. */
NB_API nb_tensor *nb_sort(nb_tensor *t, int dim, bool descending, nb_tensor **indices);
/* torch.topk: the k largest (smallest when !largest) values of floating t
 * along dim, k in [0, size of dim] (else an error naming k and the size);
 * t's shape with k at dim; indices as for nb_sort. The order is nb_sort's
 * (always sorted, whatever `sorted` says), so among equal values the lower
 * index comes first and is the one kept at the cut; PyTorch promises no
 * order of ties. A 0-d t takes k 0 or 1 and gives its value (as torch). */
NB_API nb_tensor *nb_topk(nb_tensor *t, int64_t k, int dim, bool largest, bool sorted,
                          nb_tensor **indices);
/* Sum / mean of every element of a floating t -> 0-d (the mean of none is NaN). */
NB_API nb_tensor *nb_sum_all(nb_tensor *t);
NB_API nb_tensor *nb_mean_all(nb_tensor *t);

/* ----------------------------------- matmul, softmax, masked_fill, dropout */
/* torch.matmul: 1-D x 1-D dot, 2-D product, batched with broadcast batch dims;
 * a 1-D operand gets a dim prepended (a) or appended (b), removed after.
 * a (..., M, K), b (..., K, N) -> (broadcast(...), M, N). Floating, one dtype;
 * errors: a 0-d operand, K mismatch, batch dims that do not broadcast.
 * bf16 x bf16 gives bf16: products of bf16 values summed in f32, then rounded
 * once (as PyTorch). Inside an NB_BF16 autocast region, f32 operands (and an
 * f32 with a bf16 one) are rounded to bf16 as the kernel packs them (no cast
 * copy is made) and the f32 sum is returned as f32, unrounded; its backward
 * runs its products the same way. f64 is never cast. */
NB_API nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b);

/* Mixed precision, as torch.autocast("cpu", dtype=torch.bfloat16): between
 * nb_autocast_begin(NB_BF16) and nb_autocast_end(), the matrix products of
 * nb_matmul, nb_linear and attention, and the convolutions, run in bf16 with
 * f32 accumulation (see nb_matmul); every other op, the losses, the optimizer and the parameters
 * stay f32 (master weights; bf16 needs no loss scaling), nb_gelu_tanh evaluated in float
 * rather than double there (within 5e-7 of its f32 result, at a third of the cost). Regions nest and are
 * per thread; nb_autocast_begin(NB_F32) opens a region without autocast
 * inside one. Every backward (and tangent) rule runs in the region its
 * forward ran in, wherever nb_backward is called: a product made in a bf16
 * region is differentiated in bf16, one made outside in f32 even inside a
 * bf16 region; a custom backward sees its forward's nb_autocast_dtype() and
 * may end only regions it began. 0, or -1 with a message (a
 * dtype other than bf16/f32, more than 64 nested regions, an end without a
 * begin). */
NB_API int nb_autocast_begin(nb_dtype dtype);
NB_API int nb_autocast_end(void);
/* The innermost region's dtype on this thread: NB_BF16, or NB_F32 (none). */
NB_API nb_dtype nb_autocast_dtype(void);
/* Over dim of a floating t, same shape. Stable (row max subtracted). A slice
 * that is entirely -inf gives zeros (both), not NaN, and passes zero gradient. */
NB_API nb_tensor *nb_softmax(nb_tensor *t, int dim);
NB_API nb_tensor *nb_log_softmax(nb_tensor *t, int dim);
/* value where mask (NB_BOOL) is true, t (floating) elsewhere; the result has
 * the broadcast shape of t and mask. Differentiable in t. */
NB_API nb_tensor *nb_masked_fill(nb_tensor *t, nb_tensor *mask, double value);
/* Inverted dropout on a floating t: zero with probability p, scale the rest
 * by 1/(1-p), drawing from rng (NULL = global); identity (a new handle on t)
 * when !training or p == 0; p in [0, 1], else an error. */
NB_API nb_tensor *nb_dropout(nb_tensor *t, double p, bool training, struct nb_rng *rng);
/* torch.multinomial: num_samples >= 1 category indices (NB_I64; shape
 * (num_samples) or (B, num_samples)) drawn per row of probs ((n) or (B, n),
 * floating weights, finite and >= 0, each row with a positive sum; else an
 * error naming the row and the value), with or without replacement (then
 * num_samples may not exceed the row's nonzero categories: an error, where
 * PyTorch 1.13 quietly draws zero-weight ones). Draws come from rng (NULL =
 * the global generator), one counter per (row, sample), so results do not
 * depend on the thread count; they are not PyTorch's draws. Not
 * differentiable. */
NB_API nb_tensor *nb_multinomial(nb_tensor *probs, int64_t num_samples, bool replacement,
                                 struct nb_rng *rng);

/* ------------------------------------------ convolution, pooling, batch norm */
/* As torch.nn.functional.conv1d / conv2d (cross-correlation):
 *   conv1d: input (N, C_in, L) or (C_in, L), weight (C_out, C_in/groups, K),
 *           bias (C_out) or NULL -> (N, C_out, L_out) or (C_out, L_out);
 *   conv2d: input (N, C_in, H, W) or (C_in, H, W), weight
 *           (C_out, C_in/groups, KH, KW), bias (C_out) or NULL -> (N, C_out, H_out, W_out);
 * L_out = (L + 2 padding - dilation (K - 1) - 1) / stride + 1, per dim for 2-d.
 * conv2d's stride, padding and dilation are (h, w) pairs, NULL for torch's
 * defaults (1, 0, 1). stride and dilation >= 1 (0 is an error, as in torch
 * and in nb_conv1d_init / nb_conv2d_init), padding >= 0 or NB_PADDING_SAME:
 * torch's padding="same", one setting for every dim as torch's string is,
 * spelled as conv1d's padding or as conv2d's padding[0] (padding[1] is then
 * not read; NB_PADDING_SAME in padding[1] alone is an error). "same" keeps
 * the input's size, needs stride 1, and an odd total pad puts the extra one
 * at the end, as torch. Sizes are computed exactly in int64: a padding or
 * dilation that makes the padded input or the dilated kernel pass INT64_MAX
 * is an error naming it and its value. One floating dtype; groups divides
 * C_in and C_out. Differentiable in input, weight and bias. Errors name the
 * sizes that disagree. On AVX-512 CPUs, f32 3x3 and 5x5 convs of stride 1,
 * dilation 1, one group and >= 16 channels in and out use Winograd's F(2x2, r x r):
 * 2.8x fewer multiply-adds for 5x5, with a rounding error bounded by each
 * 2x2 output tile's input patch rather than by the output's own terms
 * (docs/numerics.md); NABLA_WINOGRAD=0 in the environment turns it off.
 * Inside an NB_BF16 autocast region an f32 conv runs its products in bf16
 * with f32 sums and an f32 result, forward and backward, as nb_matmul does
 * (Winograd is then off). */
/* INT64_MIN, a value no size arithmetic gives, so that any other negative
 * padding (-1 included) is refused as torch refuses it. */
#define NB_PADDING_SAME INT64_MIN
NB_API nb_tensor *nb_conv1d(nb_tensor *input, nb_tensor *weight, nb_tensor *bias, int64_t stride,
                            int64_t padding, int64_t dilation, int64_t groups);
NB_API nb_tensor *nb_conv2d(nb_tensor *input, nb_tensor *weight, nb_tensor *bias,
                            const int64_t stride[2], const int64_t padding[2],
                            const int64_t dilation[2], int64_t groups);
/* As torch.nn.functional.max_pool2d / avg_pool2d / max_pool1d (dilation 1,
 * ceil_mode false): input (N, C, H, W) or (C, H, W) (1d: (N, C, L) or (C, L));
 * kernel_size (h, w) >= 1; stride 0 is the kernel size (torch's stride=None),
 * for each dim of 2-d and for 1-d, and so is a NULL stride array; a negative
 * stride is an error; padding NULL = 0, at most half the kernel; -inf padding
 * for max, zeros for avg (counted in the divisor when count_include_pad, as
 * torch's default). Any kernel, stride and padding up to INT64_MAX is
 * computed exactly (no int64 overflow). Max pooling's gradient goes where
 * torch's scan of the window (row-major, a value replacing the maximum when
 * greater or NaN) left the maximum: the first of equal maxima, but the last
 * NaN when the window holds several. Differentiable in input. */
NB_API nb_tensor *nb_max_pool2d(nb_tensor *input, const int64_t kernel_size[2],
                                const int64_t stride[2], const int64_t padding[2]);
NB_API nb_tensor *nb_avg_pool2d(nb_tensor *input, const int64_t kernel_size[2],
                                const int64_t stride[2], const int64_t padding[2],
                                bool count_include_pad);
NB_API nb_tensor *nb_max_pool1d(nb_tensor *input, int64_t kernel_size, int64_t stride,
                                int64_t padding);
/* As torch.nn.functional.batch_norm: input (N, C, ...) floating, statistics per
 * channel C over N and the rest. training: normalizes with the batch's mean
 * and biased variance, and when running_mean / running_var (C) are given
 * updates them in place, r = (1 - momentum) r + momentum x, with the unbiased
 * variance. Training refuses exactly one value per channel (N * rest == 1), as
 * torch; an empty batch (N * rest == 0) gives an empty output, zero gradients
 * for weight and bias, and leaves the running statistics as they were. The
 * running statistics training writes must not be expanded views nor share
 * memory with each other, the input, weight or bias. Not training: normalizes
 * with running_mean / running_var (required). weight, bias (C) or NULL; eps >=
 * 0. Differentiable in input, weight and bias (never in the running
 * statistics, which are state, not inputs). */
NB_API nb_tensor *nb_batch_norm(nb_tensor *input, nb_tensor *running_mean,
                                nb_tensor *running_var, nb_tensor *weight, nb_tensor *bias,
                                bool training, double momentum, double eps);

/* -------------------------------------------------------------------- losses */
/* A loss's reduction, as torch's reduction="mean" (the default, 0), "sum",
 * "none" (the elementwise losses, input's shape). */
typedef enum nb_reduction { NB_REDUCTION_MEAN = 0, NB_REDUCTION_SUM, NB_REDUCTION_NONE } nb_reduction;
/* (input - target)^2 reduced (torch.nn.functional.mse_loss): input and target
 * floating of one dtype and the same shape (torch broadcasts with a warning;
 * a shape that differs is an error here). Differentiable in both. */
NB_API nb_tensor *nb_mse_loss(nb_tensor *input, nb_tensor *target, nb_reduction reduction);
/* torch.nn.functional.binary_cross_entropy_with_logits:
 * -w [pos_weight y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], computed
 * stably from the logits x = input; target y the same shape as input; weight
 * broadcasting to input's shape, or NULL; pos_weight broadcasting to input's
 * shape along the last dim (one per class), or NULL. Differentiable in input,
 * target, weight and pos_weight (torch 1.13 refuses a pos_weight gradient). */
NB_API nb_tensor *nb_binary_cross_entropy_with_logits(nb_tensor *input, nb_tensor *target,
                                                      nb_tensor *weight, nb_tensor *pos_weight,
                                                      nb_reduction reduction);

/* ---------------------------------------------------------------- indexing */
/* Gathers along dim: out[i][j] = t[index[i][j]][j] (dim 0), as torch.gather;
 * index is NB_I64 of t's ndim, no larger than t outside dim, with values in
 * [0, t's size at dim); out has index's shape, t's dtype. Differentiable in t. */
NB_API nb_tensor *nb_gather(nb_tensor *t, int dim, nb_tensor *index);
/* Slices of t along dim picked by a 1-D NB_I64 index (values in [0, t's size
 * at dim)), as torch.index_select: t's shape with the size at dim replaced by
 * len(index), t's dtype. Differentiable in t. */
NB_API nb_tensor *nb_index_select(nb_tensor *t, int dim, nb_tensor *index);

/* ----------------------------------------------------------------- autograd */
/* Sets or clears requires-grad on a leaf, in place; returns t. NULL when
 * setting it on a non-floating t or clearing it on a non-leaf (a non-leaf
 * that requires grad is returned as it is; use nb_detach to stop gradients). */
NB_API nb_tensor *nb_set_requires_grad(nb_tensor *t, bool requires_grad);
/* false on NULL (and on a freed t, with a message) */
NB_API bool nb_requires_grad(const nb_tensor *t);
NB_API bool nb_is_leaf(const nb_tensor *t);       /* made by no recorded op; false on NULL */
/* The accumulated gradient of a leaf (borrowed: owned by t; t's shape and
 * dtype), or NULL when none yet or t is not a leaf. */
NB_API nb_tensor *nb_grad(const nb_tensor *t);
/* Backpropagates from a one-element tensor (seed 1); 0 or -1. Gradients
 * accumulate into the .grad of leaves that require grad. As in PyTorch, the
 * graph's saved tensors are released as each node's rule has run, so a
 * second backward through the same graph is an error (its message names
 * retain_graph); to backpropagate twice, retain it with nb_backward_with_opts.
 * Errors: loss does not require grad or has numel != 1, a saved tensor was
 * modified in place, the graph was released, a custom function's backward
 * failed. A failure midway leaves the gradients accumulated so far.
 * Threads: backward may run on any thread, on several at once when their
 * graphs share only leaves (whose .grad then adds up, under a lock); a graph
 * another thread is backpropagating through at that moment is an error. */
NB_API int nb_backward(nb_tensor *loss);
/* The same from any output, with its gradient (same shape and dtype as out). */
NB_API int nb_backward_with_grad(nb_tensor *out, nb_tensor *grad);
typedef struct nb_backward_opts {
    bool retain_graph; /* keep what backward reads, so it may run again (gradients add up) */
    /* Record the gradients themselves, so they can be differentiated again
     * (second derivatives, Hessian-vector products, gradient penalties);
     * implies retain_graph, as in PyTorch. The rules then run with grad mode
     * on and are made of recorded ops; a leaf's .grad becomes a tensor with
     * a graph, replaced (not added to in place) by later backwards. */
    bool create_graph;
} nb_backward_opts;
/* nb_backward (grad NULL: out must have one element) or nb_backward_with_grad,
 * with options (NULL = defaults, as theirs). */
NB_API int nb_backward_with_opts(nb_tensor *out, nb_tensor *grad, const nb_backward_opts *opts);
/* torch.autograd.grad: the gradients of outputs[0..n_outputs) weighted by
 * grad_outputs (NULL, or NULL entries: 1 for a one-element output) with
 * respect to inputs[0..n_inputs) (each must require grad; leaves or not),
 * returned in grads[0..n_inputs) as new tensors in the current scope (NULL
 * where an input does not reach any output). No .grad is touched and no
 * gradient hook runs; only the rules on a path to an input run. opts may be
 * NULL; with create_graph the gradients are recorded (and the graph kept).
 * 0, or -1 with a message (grads all NULL). */
NB_API int nb_autograd_grad(nb_tensor *const *outputs, int n_outputs, nb_tensor *const *grad_outputs,
                            nb_tensor *const *inputs, int n_inputs, const nb_backward_opts *opts,
                            nb_tensor **grads);
/* Gradient-ready hook (PyTorch's register_post_accumulate_grad_hook): fn(leaf,
 * ctx) runs once per backward for each leaf that backward reaches, right
 * after its .grad holds this backward's whole contribution (every path summed
 * and added in), while backward goes on with the rest of the graph. So a
 * hook can start sending a gradient while the others are being computed
 * (nabla_mpi's data parallelism does). It runs on the thread that called
 * backward, with grad mode off, leaves in the order backward finishes them
 * (about the reverse of the forward's use); it may read nb_grad(leaf), and
 * follows the callback rule (see "callbacks": freeing the leaf or the loss
 * there is deferred, a backward through the same graph is refused). It
 * returns 0, or -1 after nb_report_error: backward then stops with that
 * message (gradients accumulated so far stay, as for any failure).
 * nb_set_grad_hook(leaf, NULL, NULL) removes it; one hook per leaf (a new one
 * replaces it). Errors: leaf is not a leaf (it has a grad_fn), does not
 * require grad (the hook would never run), or is freed. */
typedef int (*nb_grad_hook)(nb_tensor *leaf, void *ctx);
NB_API int nb_set_grad_hook(nb_tensor *leaf, nb_grad_hook fn, void *ctx);
/* Gradient contribution hook (nabla's own; PyTorch has none): fn(leaf, ctx)
 * runs each time a backward adds one contribution to leaf's gradient (a
 * leaf used in k places, such as a weight tied between an embedding and an
 * output layer, gets k calls, the last one before its gradient-ready hook),
 * as soon as the op that made it has run (the seed of a backward started at
 * the leaf itself is one too). Inside fn, nb_grad_so_far(leaf)
 * is this backward's sum of the contributions so far (borrowed, read only,
 * not yet added to .grad; later contributions may be added into it in
 * place, so copy what you keep). So a hook can start sending the bulk of a
 * gradient long before the whole is known, and fix up what changed after
 * (nabla_mpi does). Same rule, thread and errors as nb_set_grad_hook; not
 * run by nb_autograd_grad. NULL fn removes it. */
NB_API int nb_set_grad_contribution_hook(nb_tensor *leaf, nb_grad_hook fn, void *ctx);
/* Inside leaf's contribution hook: this backward's gradient so far; NULL
 * anywhere else. */
NB_API nb_tensor *nb_grad_so_far(const nb_tensor *leaf);
NB_API void nb_zero_grad(nb_tensor *t);            /* sets .grad to zeros, if any */
/* Drops t's .grad (nb_grad is NULL after), as PyTorch's zero_grad(set_to_none=True):
 * the next backward then gives t its gradient's own buffer instead of adding
 * it to zeros, and no memory holds gradients between steps. A handle taken
 * from nb_grad before is freed (using it is an error naming nb_clear_grad). */
NB_API void nb_clear_grad(nb_tensor *t);
/* A view sharing t's storage, with no history and not requiring grad. */
NB_API nb_tensor *nb_detach(nb_tensor *t);
/* Grad mode is per thread; disabled, ops record nothing. */
NB_API void nb_set_grad_enabled(bool enabled);
NB_API bool nb_grad_enabled(void);
/* Anomaly detection (off at start; global, not per thread), for debugging:
 * every op that records a node checks its output, and nb_backward every
 * gradient a backward rule returns, for NaN and Inf. The first one fails the
 * op (NULL) or nb_backward (-1) with a message naming the op, the element
 * and whether the op made it or received it. Costs a pass over each tensor. */
NB_API void nb_set_detect_anomaly(bool enabled);
NB_API bool nb_detect_anomaly(void);

/* Finite-difference gradient check, like torch.autograd.gradcheck: for every
 * input that requires grad (all must be NB_F64), every element is moved by
 * +-eps and the central difference of every output element is compared with
 * the analytic Jacobian from backward: |analytic - numeric| <= atol + rtol*|numeric|.
 * Also as torch: backward runs twice from each output gradient and must give
 * the same gradients (within nondet_tol), and inputs that do not require
 * grad must get no gradient. The second run gets the same output gradient
 * transposed (strided for one dim), and in full mode one more backward from
 * an expanded (stride-0) gradient of ones must give the Jacobian's row sums:
 * a rule that reads its upstream gradient's layout wrongly fails. Gradients
 * come from nb_autograd_grad: no leaf's .grad is touched. fn must be a
 * function of its inputs alone: it is evaluated twice at the start (16 more
 * times when the check fails) and values that differ (dropout in training
 * mode) are an error saying so. A mismatch's message ends with the names of
 * the custom functions (nb_function) in the graph checked.
 * fast_mode (torch's fast_mode) compares, for each input i, the scalar
 * v^T J_i u for random unit vectors v (output) and u (input) instead of J_i
 * itself: one backward and two forwards per probe and input, so inputs of
 * any size can be checked. What it can miss: an error in a few entries of a
 * large Jacobian is diluted in the sum by about sqrt(numel(input) x
 * numel(output)) and may fall under the tolerance; a rule that is wrong
 * everywhere (a wrong sign, a wrong scale, a missing term) is caught. Check
 * a small case in full mode too. */
typedef nb_tensor *(*nb_fn)(nb_tensor **inputs, int n, void *ctx);
typedef struct nb_gradcheck_opts {
    double eps;        /* 1e-6 */
    double atol;       /* 1e-5 */
    double rtol;       /* 1e-3 */
    double nondet_tol; /* 0: the two backward passes must agree exactly */
    bool fast_mode;    /* false: full Jacobian */
    int fast_probes;   /* fast mode: random (v, u) pairs; 0 means 1 */
    uint64_t seed;     /* fast mode: seed of v and u; nb_gradgradcheck: of its v */
    /* Also compare the Jacobian forward mode gives (nb_jvp, column by
     * column; fast mode: v^T (J u)) with the numeric one, as PyTorch's
     * check_forward_ad. */
    bool check_forward_ad;
} nb_gradcheck_opts;
/* The defaults, to start from: nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS; */
#define NB_GRADCHECK_DEFAULTS {.eps = 1e-6, .atol = 1e-5, .rtol = 1e-3}
typedef struct nb_gradcheck_result {
    bool ok;
    /* The worst entry: the one whose |analytic - numeric| is max_abs_err
     * (fast mode: the worst projection; index and output_index are -1;
     * -1 everywhere when the check failed with an error). */
    int input;            /* which input, */
    int64_t index;        /* its flat (row-major) index in that input, */
    int64_t output_index; /* and the flat index of the output element, */
    double analytic, numeric; /* the two derivatives there */
    double max_abs_err;   /* the largest |analytic - numeric| (NaN if any is NaN) */
    int64_t checked;      /* Jacobian entries (fast mode: projections) compared */
    int64_t mismatched;   /* those outside the tolerance */
    char message[512];    /* always set: the summary ("nb_gradcheck: first-order: ok: ..."; the
                           * order checked is named: first-order, second-order, forward-mode;
                           * entries as positions "input 0 at (1, 2) (flat 6)"), the
                           * mismatch (also naming the first entry outside the
                           * tolerance when it is not the worst), or the error */
} nb_gradcheck_result;
/* fn must return an NB_F64 tensor; each call runs in a scope of its own.
 * opts NULL = NB_GRADCHECK_DEFAULTS; out may be NULL. false on mismatch or
 * error (nb_last_error() and out->message say why): no input requires grad;
 * one that does is not an f64 leaf, is an expanded view or shares storage
 * with another; fn fails or returns a non-f64 tensor; backward fails, is not
 * deterministic or gives a gradient to an input that does not require grad;
 * in full mode, numel(input) x numel(output) past 2^26. The inputs' values
 * and .grad are restored afterwards. */
NB_API bool nb_gradcheck(nb_fn fn, void *ctx, int n, nb_tensor **inputs,
                         const nb_gradcheck_opts *opts, nb_gradcheck_result *out);
/* torch.autograd.gradgradcheck: nb_gradcheck of the function
 * (inputs, v) -> v^T d fn/d(inputs) (the gradients nb_autograd_grad makes
 * with create_graph, flattened and concatenated), with v, the output
 * gradient, drawn from opts->seed uniform in [-1, 1) and checked as an
 * input too: so fn's double backward is compared with finite differences
 * of its backward. Same options, result and errors as nb_gradcheck; the
 * messages say "second-order". */
NB_API bool nb_gradgradcheck(nb_fn fn, void *ctx, int n, nb_tensor **inputs,
                             const nb_gradcheck_opts *opts, nb_gradcheck_result *out);
/* torch.func.jvp, forward mode: out = fn(inputs) and out_tangent = J . tangents,
 * the directional derivative along tangents[i] for input i (NULL: zero), each
 * of its input's shape and dtype. fn runs once; every op it runs pushes the
 * tangents through its tangent rule (no backward runs). fn follows the
 * callback rule; its inputs are handed to it as views with no history (those
 * that require grad still do, so a backward inside fn works). out
 * (with no history) and out_tangent are new tensors in the current scope.
 * 0, or -1 with a message (an op fn ran has no tangent rule: its name). */
NB_API int nb_jvp(nb_fn fn, void *ctx, int n, nb_tensor **inputs, nb_tensor **tangents,
                  nb_tensor **out, nb_tensor **out_tangent);

/* Activation checkpointing, as torch.utils.checkpoint: out = fn(inputs),
 * computed so that nothing fn makes is kept for backward; backward runs fn
 * again (from the inputs, which are kept) and backpropagates through that
 * run. Memory: one checkpointed block's intermediates at a time instead of
 * every block's; time: one more forward of fn per backward.
 * - Gradients are those of a plain backward, bit for bit, on any thread
 *   count: every random draw fn makes (nb_dropout, nb_rand, nb_multinomial,
 *   ... from any stream) is replayed in the second run, and the autocast
 *   dtype in force at the call is in force again.
 * - Tensors fn reaches through ctx that require grad (a block's parameters)
 *   get their gradients as without it (.grad, nb_autograd_grad, hooks; the
 *   contribution hook sees fn's sum as one contribution); a tensor with
 *   history reached that way is refused (pass it in inputs). fn gets views
 *   of its inputs without history; it must leave them alive, unwritten and
 *   as they were, and compute the same thing each time (the same draws from
 *   the same streams, the same output shape: otherwise backward fails
 *   saying so). What fn reaches through ctx must stay alive and unchanged
 *   until backward: an input or parameter written in place after the
 *   forward (an optimizer step) makes backward fail with a message.
 *   Draws inside nb_parallel_for's ranges cannot be replayed (which thread
 *   runs which range varies): nb_checkpoint fails saying so; draw on fn's
 *   own thread (threads fn starts itself are not watched: no draws there).
 * - With grad mode off, fn just runs. nb_jvp (forward mode) through it
 *   runs fn again under nb_jvp, draws replayed. create_graph through it is
 *   refused with a message (call fn directly for second derivatives). fn
 *   follows the callback rule.
 * out is a new tensor in the current scope; NULL with a message when fn
 * fails (quoting its message) or an argument is bad. */
NB_API nb_tensor *nb_checkpoint(nb_fn fn, void *ctx, int n, nb_tensor **inputs);

/* ------------------------------------------------------------ callbacks
 * The one rule for user code nabla calls: a custom function's forward,
 * backward, jvp and destroy (and their _multi forms), gradient hooks
 * (nb_grad_hook), nb_gradcheck's function (nb_fn), nb_parallel_for's fn and
 * nb_gpt_generate's on_token. A callback may call any nabla function, and:
 * - What nabla is using while it runs cannot be destroyed under it. Freeing
 *   it there is deferred: the handle dies at once, the object when nabla is
 *   done (the root of a backward and every tensor of the graph being walked;
 *   the model being generated from: nb_gpt_free in on_token stops generation
 *   with an error and frees the model when nb_gpt_generate returns). Where
 *   the caller would be left with a broken result the call fails instead (the
 *   handle is freed, as asked): a forward that frees one of its inputs;
 *   nb_gradcheck's function that frees or writes one of the inputs, or
 *   changes its requires_grad (values and flags are put back); on_token that
 *   re-initializes the model or frees its registry. nb_free of a borrowed
 *   handle (nb_grad, nb_function_saved) is refused with a message.
 * - Scopes: it may open and close its own; nb_scope_end on a scope opened
 *   before it ran is refused (the caller's scopes stay open), and scopes it
 *   leaves open are closed when it returns. Either is an error of the call
 *   that ran it: "nb_backward: rmsnorm's backward closed a scope it did not
 *   open (...)", "... left 1 scope open (...)"; the same for callback frames
 *   (nb_callback_begin without its end).
 * - Grad mode is restored when it returns. A custom function's forward, jvp
 *   and backward (except under create_graph, where the backward runs with
 *   grad mode on, so that what it computes is recorded) and gradient hooks
 *   run with grad mode off, and
 *   nb_set_grad_enabled(true) there is refused and an error of the call
 *   ("... turned grad mode on ..."); nabla's own functions called there
 *   (nb_gradcheck) may still use grad mode.
 * - It may start a backward through other graphs, not through the graph
 *   being walked (an error naming the callback); on_token may not start a
 *   second generation on the model being generated from.
 * - Freed handles are errors inside callbacks, even during backward. A
 *   callback on one thread may free a persistent tensor another thread's
 *   backward is walking (the object waits for that walk).
 * docs/custom-functions.md has the table of every kind x misbehaviour. */
/* ------------------------------------------------- custom functions (ops) */
/* Your own differentiable op with a hand-written backward, as PyTorch's
 * torch.autograd.Function: nb_function_apply runs forward (grad mode off
 * inside) and, when grad mode is on and an input requires grad, records a
 * graph node whose backward is yours. Everything nabla's own ops get, yours
 * get: nb_gradcheck checks your backward; anomaly mode names your function;
 * saved tensors are version-checked (written in place after saving: backward
 * fails); a gradient of the wrong shape or dtype, a freed tensor returned,
 * or a backward that fails is an error of nb_backward naming the function
 * and the input; the context and what it saved are freed with the graph
 * (scope end, or after backward unless the graph is retained). Callbacks
 * follow the rule above ("callbacks"); they report errors with
 * nb_report_error. Every
 * message about the function names it by `name`. */
typedef struct nb_function_ctx nb_function_ctx; /* opaque; valid during the callbacks */
typedef struct nb_function {
    const char *name; /* used in every message about it, e.g. "my_gelu" */
    /* Computes the output from the inputs (with grad mode off inside). NULL
     * on error (after nb_report_error). May call nb_function_save. Runs in a
     * scope of its own: the tensor it returns becomes the op's output, in the
     * caller's scope; other tensors it makes are freed when it returns
     * (nb_keep hands one to the caller's scope). An input, or any tensor not
     * made here, returned as it is gets a new handle, a view. */
    nb_tensor *(*forward)(nb_function_ctx *ctx, nb_tensor **inputs, int n, void *user);
    /* Given dL/d(output) (the output's shape and dtype), sets grad_inputs[i]
     * (NULL = no gradient; each of input i's shape and dtype) for each input;
     * returns 0, or -1 after nb_report_error. Runs with grad mode off, inside
     * a scope that ends after nabla took the gradients. Gradients set for
     * inputs that do not need them are ignored. Under create_graph it runs
     * with grad mode on (nb_grad_enabled() tells): written with nabla ops on
     * its inputs and output (nb_function_saved then gives them with their
     * history) and grad_output, it is differentiable again; one that reads
     * raw values of a tensor that requires grad (nb_data, nb_item,
     * nb_copy_to_f64) or uses a saved tensor that is neither an input nor
     * the output gives gradients a second derivative refuses, naming the
     * function (PyTorch's once_differentiable; docs/derivatives.md). */
    int (*backward)(nb_function_ctx *ctx, nb_tensor *grad_output, nb_tensor **grad_inputs,
                    void *user);
    /* Optional: called once for each nb_function_apply, with its user
     * pointer, when nabla no longer needs it (the node is freed, or at once
     * when no node was recorded or apply failed). */
    void (*destroy)(void *user);
    /* Optional, for several outputs (nb_function_apply_multi, which uses
     * these instead of forward/backward): forward fills outputs[0..nout-1]
     * and returns 0 or -1; backward gets one gradient per output (zeros for
     * an output that got none or was marked non-differentiable; NULL for an
     * integer or bool output). */
    int (*forward_multi)(nb_function_ctx *ctx, nb_tensor **inputs, int n, nb_tensor **outputs,
                         int nout, void *user);
    int (*backward_multi)(nb_function_ctx *ctx, nb_tensor **grad_outputs, int nout,
                          nb_tensor **grad_inputs, void *user);
    /* Optional, forward mode (nb_jvp; one output): the output's tangent from
     * the inputs' tangents (NULL for an input whose tangent is zero), of the
     * output's shape and dtype; NULL after nb_report_error. Runs with grad
     * mode off; may read nb_function_saved. Without it, nb_jvp through the
     * function is an error naming it. */
    nb_tensor *(*jvp)(nb_function_ctx *ctx, nb_tensor **input_tangents, int n, void *user);
} nb_function;
/* Applies f to inputs[0..n-1] (live tensors; n >= 0): the output, in the
 * current scope, or NULL with a message naming f (forward failed or returned
 * NULL, a freed tensor or no tensor; f or its name or forward is NULL; grad
 * is needed and f has no backward). */
NB_API nb_tensor *nb_function_apply(const nb_function *f, nb_tensor **inputs, int n, void *user);
/* The same for f->forward_multi / backward_multi with nout >= 1 outputs,
 * written to outputs (all NULL on error); 0 or -1. */
NB_API int nb_function_apply_multi(const nb_function *f, nb_tensor **inputs, int n,
                                   nb_tensor **outputs, int nout, void *user);
/* In forward: keeps t (an input, the output, or any tensor) for backward, as
 * ctx.save_for_backward. It is version-checked: written in place before
 * backward runs, backward fails. 0 or -1 (outside forward, t NULL or freed). */
NB_API int nb_function_save(nb_function_ctx *ctx, nb_tensor *t);
/* In backward (or forward): saved tensor i, in save order (borrowed: a
 * handle that shares t's storage and has no history); NULL + message when
 * i is out of range. */
NB_API nb_tensor *nb_function_saved(nb_function_ctx *ctx, int i);
/* Whether backward must compute the gradient of input i (grad mode was on at
 * apply and input i requires grad), as ctx.needs_input_grad; false + message
 * when i is out of range. */
NB_API bool nb_function_needs_input_grad(nb_function_ctx *ctx, int i);
/* In forward: output t (what forward returns, or one of the multi outputs)
 * is not differentiable (indices, masks, counts): it gets no graph and
 * does not require grad, as ctx.mark_non_differentiable. 0 or -1. */
NB_API int nb_function_mark_non_differentiable(nb_function_ctx *ctx, nb_tensor *t);

/* ------------------------------------------------------------ memory: scopes */
/* Every tensor made between begin and end is freed by end. Scopes nest; the
 * stack is per thread. Outside any scope tensors are persistent. nb_scope_end
 * with no scope open is an error; nb_scope_depth counts the open scopes. */
NB_API void nb_scope_begin(void);
NB_API void nb_scope_end(void);
NB_API int nb_scope_depth(void);
/* For code built on nabla that calls user code itself (nn/ does, for
 * nb_gpt_generate's on_token): between token = nb_callback_begin(fn, who)
 * and nb_callback_end(token) the callback rule (see "callbacks" below)
 * holds as for nabla's own callbacks. begin returns a token > 0 (or -1 with
 * a message). nb_callback_end returns -1 with "fn: who ..." when the
 * callback broke the rule (its scopes and callback frames are closed, grad
 * mode is restored), or when token is not that of a begin open in the
 * callback running now; 0 otherwise. */
NB_API int nb_callback_begin(const char *fn, const char *who);
NB_API int nb_callback_end(int token);
/* Hands t's values to the enclosing scope (persistent at depth 1 or 0):
 * returns a new detached tensor sharing t's storage, which survives this scope. */
NB_API nb_tensor *nb_keep(nb_tensor *t);
/* Frees a tensor now (persistent or scoped; a borrowed one is left to its
 * owner, with a message). Storage shared with views, or saved by a recorded graph for
 * backward, lives on until they are gone too (or, for the graph, until a
 * backward released it); a graph that only passes through t (no backward
 * rule reads it) lets its storage go at once. NULL is ok; a handle freed
 * already is reported (a message), not freed twice. */
NB_API void nb_free(nb_tensor *t);
/* Persistent handle on t's storage, detached, owned by no scope (nb_free it). */
NB_API nb_tensor *nb_persistent(nb_tensor *t);
/* For code that owns tensors and lends them out (nb_params does): a
 * persistent handle as nb_persistent gives, but nb_free refuses it (a
 * message); the owner frees it with nb_free_with_owner, after which a use
 * of the handle reports that it was freed with its owner. */
NB_API nb_tensor *nb_persistent_held(nb_tensor *t);
NB_API void nb_free_with_owner(nb_tensor *t);
NB_API int64_t nb_live_tensors(void); /* tensor objects alive (all threads) */
/* Storage bytes (all threads), as torch.cuda.memory_allocated and friends:
 * in use now, the peak since the last reset, and held in the cache of freed
 * buffers that new tensors reuse (so fresh pages are not faulted in per op or
 * per training step): at most NABLA_CACHE_MB MiB when that is set, else at
 * most the larger of 1 GiB and the most bytes ever in use at once; and a
 * new buffer the cache cannot serve first gives cached ones back until in
 * use + cached stays within that most (so the footprint follows the peak in
 * use). nb_empty_cache returns the cache to the system. */
NB_API int64_t nb_memory_allocated(void);
NB_API int64_t nb_memory_peak(void);
NB_API void nb_memory_reset_peak(void);
NB_API int64_t nb_memory_cached(void);
/* The cache's limit in bytes: NABLA_CACHE_MB MiB (a decimal count; unset,
 * empty or not a plain number means the default, 1024 (not a number: said
 * once on stderr), which the cache
 * may pass up to the peak of bytes in use), read once per process; -1 when
 * the count is too large to be a byte size (no limit). */
NB_API int64_t nb_memory_cache_limit(void);
NB_API void nb_empty_cache(void);

/* ------------------------------------------------------------------- errors */
/* The message of the most recent failure on this thread, or NULL if none
 * since nb_clear_error (a thread-local buffer of 1 KiB the next failure
 * overwrites). A failure caused by a NULL input says so and quotes the last
 * message that was not about a NULL: "nb_relu: input 0 is NULL, after an
 * earlier error: nb_matmul: shapes (2,3) and (4,5) cannot be multiplied
 * (3 != 4)". NABLA_ABORT_ON_ERROR=1 in the environment prints the first
 * error to stderr and calls abort(). */
NB_API const char *nb_last_error(void);
NB_API void nb_clear_error(void); /* forgets the message: nb_last_error() is NULL */
/* The argument check nabla's own functions make, for functions you build on
 * it: 0 when t is a live tensor; otherwise -1 and the message "fn: input i
 * is NULL" (with the earlier error, as above) or "fn: input i was freed
 * (by nb_free) and cannot be used". */
NB_API int nb_check_input(const char *fn, const nb_tensor *t, int i);
/* Sets the message (printf-style), for code built on nabla that reports its
 * own errors the same way (nn/ does). Honors NABLA_ABORT_ON_ERROR. */
NB_API void nb_report_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---------------------------------------------------------------- rng, threads */
/* Restarts rng at (seed, offset 0); NULL = the global generator. */
NB_API void nb_rng_seed(nb_rng *rng, uint64_t seed);
NB_API void nb_manual_seed(uint64_t seed); /* the global generator */
/* The generator used when an rng argument is NULL (borrowed, process-wide;
 * several threads may draw from it at once, each getting other numbers). */
NB_API nb_rng *nb_global_rng(void);
/* The thread count for kernels (1..64; another n is an error, unchanged):
 * default NABLA_NUM_THREADS (a whole number, at most 64; another value is
 * ignored and said once on stderr) or the CPUs the process may run on (its
 * affinity mask, all online CPUs unless a cpuset narrows it). Kernels split work across a
 * persistent pool only above a size where it pays; each output element is
 * always computed the same way, so results are bitwise identical for any count. */
NB_API void nb_set_num_threads(int n);
NB_API int nb_num_threads(void);
/* Runs fn(ctx, lo, hi) over contiguous ranges covering [0, n), each of at
 * least `grain` items (but the last), on the pool, and returns when all are
 * done. Each range runs in a scope of its own (tensors fn makes are freed
 * when the range ends, on any thread; nb_keep out of it is refused, as a
 * worker has no scope to hand them to) under the callback rule. fn must
 * handle each item wholly within its range (then results do not depend on
 * the thread count). A call made from inside fn, or while
 * another thread uses the pool, runs serially on its caller. n <= 0 runs
 * nothing; a NULL fn is an error. */
NB_API void nb_parallel_for(int64_t n, int64_t grain,
                            void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx);

/* ========================================================================= nn
 * The neural-network layer: parameter registry, checkpoints, functional
 * forms, modules, optimizers. Built only from the public API above. A module
 * is a small public struct (keep it on the stack or in your model struct);
 * its parameters are persistent tensors registered by name in an nb_params
 * registry, which owns them. Names follow PyTorch's state_dict keys:
 * nb_mha_init(&m, ps, "decoder.layers.0.src_attn", ...) registers
 * "decoder.layers.0.src_attn.w_q.weight", ... Parameters are made in
 * nb_default_dtype(). A full parameter name longer than 511 bytes makes the
 * *_init function fail (parameters it registered before stay registered). */

/* -------------------------------------------------- nn: parameter registry */
typedef struct nb_params nb_params; /* opaque, ordered by registration */
typedef struct nb_optim nb_optim;   /* opaque: an optimizer (see nn: optimizers) */
NB_API nb_params *nb_params_new(void); /* empty; the caller's, freed by nb_params_free */
NB_API void nb_params_free(nb_params *ps); /* frees its tensors too; NULL is ok */
/* For code that keeps using a registry while calling user code that might
 * free it (nabla_mpi gives its shard to make): while held, nb_params_free
 * only marks it, and the last nb_params_release frees it (exactly once). */
NB_API void nb_params_hold(nb_params *ps);
NB_API void nb_params_release(nb_params *ps); /* without a hold: a message, nothing done */
/* Registers t's values under name: the registry keeps its own persistent
 * handle on t's storage (requires grad) and returns it (borrowed); t itself
 * stays the caller's (freed by its scope, or by nb_free). NULL for a
 * duplicate name (among parameters and buffers), the name "__metadata__"
 * (reserved by the safetensors format) or a t not NB_F32/NB_F64. Names are
 * hashed: registering and nb_params_get take constant time on average. */
NB_API nb_tensor *nb_params_add(nb_params *ps, const char *name, nb_tensor *t);
NB_API nb_tensor *nb_params_get(nb_params *ps, const char *name); /* NULL + message if absent */
NB_API int nb_params_count(const nb_params *ps); /* parameters; 0 for NULL */
/* Parameter i (0..count-1) in registration order, borrowed, and its name
 * (owned by the registry) in *name unless name is NULL; NULL if i is out of range. */
NB_API nb_tensor *nb_params_at(const nb_params *ps, int i, const char **name);
NB_API int64_t nb_params_numel(const nb_params *ps); /* elements in all parameters; 0 for NULL */
NB_API void nb_params_zero_grad(nb_params *ps);      /* nb_zero_grad on every parameter */
/* Buffers, as PyTorch's register_buffer: state of any dtype that is saved and
 * loaded with the registry but not trained (no grad). nb_params_count/at,
 * nb_params_numel, nb_params_zero_grad, optimizers and nb_clip_grad_norm see
 * parameters only; nb_params_get finds both. Same ownership as nb_params_add. */
NB_API nb_tensor *nb_params_add_buffer(nb_params *ps, const char *name, nb_tensor *t);
NB_API int nb_params_buffer_count(const nb_params *ps); /* as nb_params_count, for buffers */
NB_API nb_tensor *nb_params_buffer_at(const nb_params *ps, int i, const char **name); /* same */
/* Registers every parameter and buffer of src in dst as prefix + name (prefix
 * NULL = ""), sharing their storage (a checkpoint of several registries in
 * one file); parameters stay parameters, buffers buffers. 0 or -1 (dst == src,
 * a name dst has already, prefix + name over 1023 bytes or equal to
 * "__metadata__"); on error dst is unchanged. */
NB_API int nb_params_add_all(nb_params *dst, const char *prefix, const nb_params *src);

/* ------------------------------------------- nn: checkpoints (safetensors) */
/* Checkpoints in the safetensors format: 8-byte little-endian header size, a
 * JSON header {name: {dtype, shape, data_offsets}} (plus "__metadata__"), then
 * the raw little-endian data. Names are the registry's (PyTorch state_dict
 * keys); dtypes F32, F64, I64, BOOL.
 * nb_save writes every parameter and buffer to path through a temporary file
 * in the same directory, fsync and a rename, so an interrupted save leaves
 * the previous file whole. The temporary has no name while it is written
 * where the file system allows (Linux's O_TMPFILE: a killed save leaves
 * nothing); elsewhere it is ".nabla-tmp-<pid>-<n>". A path that is a symbolic
 * link is followed: the file it names is replaced and the link stays a link.
 * A file replaced keeps its permission bits (user, group, other); a new file
 * gets 0666 & ~umask. Each save and each load also removes the temporaries
 * that killed saves left in that directory (those whose lock no process
 * holds; docs/checkpoints.md, "Killed saves"). 0 or -1 (message names the
 * path and the reason). */
NB_API int nb_save(const nb_params *ps, const char *path);
/* Reads path, a regular file (a FIFO or device is refused at once, not
 * waited on), into the registry's tensors. The file must hold exactly the
 * registry's names, each with the same dtype and shape, and an optimizer's
 * state (nb_optim_state, also under an nb_params_add_all prefix) values it
 * can resume from: steps in [0, 2^53], exp_avg_sq finite and >= 0, exp_avg
 * and momentum_buffer finite; otherwise -1 with a message naming the first
 * mismatch, and no tensor is changed. Files up to the memory available (the
 * whole file is read and checked before any tensor is written); headers up
 * to 100 MiB. Names are matched through hash indexes: a million tensors
 * load in about a second. */
NB_API int nb_load(nb_params *ps, const char *path);

/* ---------------------------------------------------- nn: functional forms */
/* x (..., in), w (out, in), b (out) or NULL -> (..., out) = x w^T + b; one
 * floating dtype. */
NB_API nb_tensor *nb_linear(nb_tensor *x, nb_tensor *w, nb_tensor *b);
/* weight (num, dim), idx NB_I64 (...) (at most 7-d, values in [0, num))
 * -> (..., dim), weight's dtype; differentiable in weight. */
NB_API nb_tensor *nb_embedding(nb_tensor *weight, nb_tensor *idx);
/* Over the last dim, as torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) * w + b
 * with the biased variance; x (..., dim) floating, w, b (dim) of x's dtype or
 * NULL, eps >= 0 -> (..., dim). */
NB_API nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *w, nb_tensor *b, double eps);
/* As torch.nn.CrossEntropyLoss (mean reduction): logits (N, C) floating,
 * targets NB_I64 (N) in [0, C); targets equal to ignore_index count for
 * nothing (use -1 for none; all ignored gives NaN, as torch); label_smoothing
 * in [0, 1]. A row whose logits are all -inf costs +inf (torch: NaN), so the
 * mean is +inf: no class can be the target there. Returns a 0-d tensor. */
NB_API nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *targets, int64_t ignore_index,
                                   double label_smoothing);
/* Scaled dot-product attention built from public ops:
 * softmax(q k^T / sqrt(D) with -inf where keep_mask is false) -> dropout -> · v.
 * q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) -> (..., Lq, Dv).
 * keep_mask NB_BOOL broadcasting to (..., Lq, Lk), true = may attend, or NULL:
 * (B,1,1,Lk) padding, (Lq,Lk) causal, (B,1,Lq,Lk) both. A fully masked row
 * attends to nothing (zero weights, zero output). q, k, v of one floating
 * dtype, D > 0; a keep_mask that would enlarge the scores is an error.
 * weights_out (optional) receives the post-dropout weights (..., Lq, Lk), a
 * tensor of the current scope, or NULL on error. */
NB_API nb_tensor *nb_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *keep_mask,
                               double dropout_p, bool training, nb_rng *rng,
                               nb_tensor **weights_out);

/* -------------------------------------------- nn: modules and initializers */
typedef struct nb_Linear {
    nb_tensor *weight; /* (out, in): kaiming-uniform(a = sqrt 5), i.e. U(+-1/sqrt(in)) */
    nb_tensor *bias;   /* (out) U(+-1/sqrt(in)), or NULL */
    int64_t in_features, out_features;
} nb_Linear;
/* Module inits (nb_*_init) fill m and register its parameters in ps under
 * "<name>." + PyTorch's names, in nb_default_dtype(), drawn from rng (NULL =
 * global); m only borrows them (no free needed). 0, or -1 for a NULL m or ps
 * or a size <= 0; on error the parameters registered before stay in ps.
 * Forwards are the functional forms with m's parameters (current scope). */
NB_API int nb_linear_init(nb_Linear *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                          bool bias, nb_rng *rng);
NB_API nb_tensor *nb_linear_forward(const nb_Linear *m, nb_tensor *x); /* (..., in) -> (..., out) */

typedef struct nb_Embedding {
    nb_tensor *weight; /* (num, dim), N(0, 1) as torch */
    int64_t num_embeddings, embedding_dim;
} nb_Embedding;
/* Registers "<name>.weight". Forward: idx NB_I64 (...) -> (..., dim). */
NB_API int nb_embedding_init(nb_Embedding *m, nb_params *ps, const char *name, int64_t num,
                             int64_t dim, nb_rng *rng);
NB_API nb_tensor *nb_embedding_forward(const nb_Embedding *m, nb_tensor *idx);

typedef struct nb_LayerNorm {
    nb_tensor *weight, *bias; /* (dim): ones, zeros */
    int64_t dim;
    double eps;
} nb_LayerNorm;
/* Registers "<name>.weight", "<name>.bias"; eps >= 0. Forward: x (..., dim) -> (..., dim). */
NB_API int nb_layernorm_init(nb_LayerNorm *m, nb_params *ps, const char *name, int64_t dim,
                             double eps);
NB_API nb_tensor *nb_layernorm_forward(const nb_LayerNorm *m, nb_tensor *x);

typedef struct nb_Conv2d {
    nb_tensor *weight; /* (out, in/groups, kh, kw): U(+-1/sqrt(fan_in)), fan_in = in/groups*kh*kw */
    nb_tensor *bias;   /* (out), the same bound, or NULL */
    int64_t in_channels, out_channels, kernel_size[2], stride[2], padding[2], dilation[2], groups;
} nb_Conv2d;
/* Registers "<name>.weight" (and "<name>.bias"), as torch.nn.Conv2d; stride,
 * padding, dilation NULL = torch's defaults (1, 0, 1), elements as nb_conv2d
 * takes them (stride and dilation >= 1; padding[0] NB_PADDING_SAME: "same"
 * in both dims, kept as {NB_PADDING_SAME, NB_PADDING_SAME}). Forward:
 * nb_conv2d with m's parameters. */
NB_API int nb_conv2d_init(nb_Conv2d *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                          const int64_t kernel_size[2], const int64_t stride[2],
                          const int64_t padding[2], const int64_t dilation[2], int64_t groups,
                          bool bias, nb_rng *rng);
NB_API nb_tensor *nb_conv2d_forward(const nb_Conv2d *m, nb_tensor *x);

typedef struct nb_Conv1d {
    nb_tensor *weight; /* (out, in/groups, k), as nb_Conv2d */
    nb_tensor *bias;
    int64_t in_channels, out_channels, kernel_size, stride, padding, dilation, groups;
} nb_Conv1d;
/* As nb_conv2d_init for torch.nn.Conv1d: stride and dilation >= 1 (0 is an
 * error, as in nb_conv1d), padding >= 0 or NB_PADDING_SAME. */
NB_API int nb_conv1d_init(nb_Conv1d *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                          int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation,
                          int64_t groups, bool bias, nb_rng *rng);
NB_API nb_tensor *nb_conv1d_forward(const nb_Conv1d *m, nb_tensor *x);

typedef struct nb_BatchNorm {
    nb_tensor *weight, *bias;                /* (C): ones, zeros (parameters) */
    nb_tensor *running_mean, *running_var;   /* (C): zeros, ones (buffers) */
    nb_tensor *num_batches_tracked;          /* 0-d NB_I64 (buffer) */
    int64_t num_features;
    double eps, momentum;
    bool training;                           /* true after init; set it for eval */
    int dims;                                /* 1 (BatchNorm1d) or 2 (BatchNorm2d) */
} nb_BatchNorm;
/* torch.nn.BatchNorm1d (input (N, C) or (N, C, L)) and BatchNorm2d (input
 * (N, C, H, W)): registers "<name>.weight", "<name>.bias" and the buffers
 * "<name>.running_mean", "<name>.running_var", "<name>.num_batches_tracked"
 * (torch's state_dict names; nb_save writes them). Forward in training
 * normalizes with the batch's statistics, updates the running ones and adds
 * 1 to num_batches_tracked; in eval uses the running ones. eps > 0 (torch
 * 1e-5), momentum in [0, 1] (torch 0.1). */
NB_API int nb_batchnorm1d_init(nb_BatchNorm *m, nb_params *ps, const char *name,
                               int64_t num_features, double eps, double momentum);
NB_API int nb_batchnorm2d_init(nb_BatchNorm *m, nb_params *ps, const char *name,
                               int64_t num_features, double eps, double momentum);
NB_API nb_tensor *nb_batchnorm_forward(nb_BatchNorm *m, nb_tensor *x);

/* Recurrent cells, as torch.nn.RNNCell / GRUCell / LSTMCell, one time step,
 * built from nb_linear, nb_tanh, nb_sigmoid and elementwise ops. Parameters
 * "<name>.weight_ih" (G*hidden, input), "<name>.weight_hh" (G*hidden, hidden),
 * "<name>.bias_ih", "<name>.bias_hh" (G*hidden), G = 1, 3 (gates r, z, n) and
 * 4 (gates i, f, g, o) in torch's order, all U(+-1/sqrt(hidden)): weights move
 * to and from torch through safetensors unchanged. x (B, input) or (input);
 * h and c (B, hidden) or (hidden), NULL = zeros. */
typedef struct nb_RNNCell {
    nb_tensor *weight_ih, *weight_hh, *bias_ih, *bias_hh; /* biases NULL without bias */
    int64_t input_size, hidden_size;
    bool relu; /* nb_RNNCell only: nonlinearity "relu" instead of "tanh" */
} nb_RNNCell;
typedef nb_RNNCell nb_GRUCell;
typedef nb_RNNCell nb_LSTMCell;
NB_API int nb_rnncell_init(nb_RNNCell *m, nb_params *ps, const char *name, int64_t input_size,
                           int64_t hidden_size, bool bias, bool relu, nb_rng *rng);
/* h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (relu when m->relu). */
NB_API nb_tensor *nb_rnncell_forward(const nb_RNNCell *m, nb_tensor *x, nb_tensor *h);
NB_API int nb_grucell_init(nb_GRUCell *m, nb_params *ps, const char *name, int64_t input_size,
                           int64_t hidden_size, bool bias, nb_rng *rng);
NB_API nb_tensor *nb_grucell_forward(const nb_GRUCell *m, nb_tensor *x, nb_tensor *h);
NB_API int nb_lstmcell_init(nb_LSTMCell *m, nb_params *ps, const char *name, int64_t input_size,
                            int64_t hidden_size, bool bias, nb_rng *rng);
/* (h, c) -> (h', c'): h_out and c_out receive tensors of the current scope
 * (NULL on error); returns 0 or -1. */
NB_API int nb_lstmcell_forward(const nb_LSTMCell *m, nb_tensor *x, nb_tensor *h, nb_tensor *c,
                               nb_tensor **h_out, nb_tensor **c_out);

/* Multi-head attention, batch first: projections w_q w_k w_v w_o (d_model x
 * d_model), heads split with view + transpose to (B, H, L, d_k). */
typedef struct nb_MHA {
    nb_Linear w_q, w_k, w_v, w_o;
    int64_t d_model, heads, d_k;
    double dropout;
} nb_MHA;
/* Registers "<name>.w_q.weight", "<name>.w_q.bias", ..., "<name>.w_o.bias" (no
 * biases unless bias); heads must divide d_model; dropout (on the attention
 * weights) in [0, 1]. */
NB_API int nb_mha_init(nb_MHA *m, nb_params *ps, const char *name, int64_t d_model,
                       int64_t heads, double dropout, bool bias, nb_rng *rng);
/* q (B, Lq, d_model), k and v (B, Lk, d_model), the parameters' dtype ->
 * (B, Lq, d_model); keep_mask as nb_attention, broadcasting to (B, H, Lq, Lk);
 * weights_out (optional) receives the per-head weights (B, H, Lq, Lk). */
NB_API nb_tensor *nb_mha_forward(nb_MHA *m, nb_tensor *q, nb_tensor *k, nb_tensor *v,
                                 nb_tensor *keep_mask, bool training, nb_rng *rng,
                                 nb_tensor **weights_out);

/* The activations a feed-forward layer can use: nb_relu, nb_gelu (erf),
 * nb_gelu_tanh (GPT-2's), nb_silu. */
typedef enum {
    NB_ACT_RELU = 0,
    NB_ACT_GELU = 1,
    NB_ACT_GELU_TANH = 2,
    NB_ACT_SILU = 3
} nb_activation;
/* x passed through the activation act; an unknown act is an error. */
NB_API nb_tensor *nb_activate(nb_tensor *x, nb_activation act);

/* Position-wise feed-forward: w_2(dropout(activation(w_1(x)))). */
typedef struct nb_FeedForward {
    nb_Linear w_1, w_2; /* (d_ff, d_model), (d_model, d_ff) */
    double dropout;
    nb_activation activation; /* NB_ACT_RELU after init; set it to choose another */
} nb_FeedForward;
/* Registers "<name>.w_1.weight", "<name>.w_1.bias", "<name>.w_2..."; dropout in
 * [0, 1]; the activation is ReLU (The Annotated Transformer's) until the
 * caller sets m->activation. Forward: x (..., d_model) -> (..., d_model),
 * dropout only when training, drawing from rng (NULL = global). */
NB_API int nb_feedforward_init(nb_FeedForward *m, nb_params *ps, const char *name,
                               int64_t d_model, int64_t d_ff, double dropout, nb_rng *rng);
NB_API nb_tensor *nb_feedforward_forward(const nb_FeedForward *m, nb_tensor *x, bool training,
                                         nb_rng *rng);

/* Sinusoidal positional encoding table (max_len, d_model), as The Annotated
 * Transformer: pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos(...).
 * Sizes > 0. Persistent whatever scope is open: nb_free it. */
NB_API nb_tensor *nb_positional_encoding(int64_t max_len, int64_t d_model, nb_dtype dtype);
/* Fills t in place with U(+-sqrt(6 / (fan_in + fan_out))), torch's
 * xavier_uniform_: t floating, at least 2-d; fan_in = size(1), fan_out =
 * size(0), each times the product of dims 2 and up. Not recorded; 0 or -1. */
NB_API int nb_init_xavier_uniform(nb_tensor *t, nb_rng *rng);

/* The encoder-decoder of The Annotated Transformer, pre-norm: each sublayer
 * is x + dropout(sublayer(norm(x))); final norms on both stacks; the
 * generator is a linear layer to the target vocabulary. Parameter names:
 * src_embed.weight, tgt_embed.weight, encoder.layers.{i}.self_attn.w_q.weight,
 * encoder.layers.{i}.feed_forward.w_1.weight, encoder.layers.{i}.norm1.weight,
 * ..., decoder.layers.{i}.src_attn..., encoder.norm.weight, decoder.norm.weight,
 * generator.weight, generator.bias. */
typedef struct nb_EncoderLayer {
    nb_MHA self_attn;
    nb_FeedForward feed_forward;
    nb_LayerNorm norm1, norm2;
    nb_tensor *self_weights; /* (B,H,L,L) of the last forward, when keep_attention */
} nb_EncoderLayer;
typedef struct nb_DecoderLayer {
    nb_MHA self_attn, src_attn;
    nb_FeedForward feed_forward;
    nb_LayerNorm norm1, norm2, norm3;
    nb_tensor *self_weights, *src_weights; /* (B,H,Lt,Lt), (B,H,Lt,Ls), when keep_attention */
} nb_DecoderLayer;
typedef struct nb_TransformerConfig {
    int64_t src_vocab, tgt_vocab;
    int64_t d_model, d_ff, heads, layers;
    int64_t max_len;  /* longest sequence (positional table) */
    double dropout;
} nb_TransformerConfig;
typedef struct nb_Transformer {
    nb_TransformerConfig cfg;
    nb_Embedding src_embed, tgt_embed; /* scaled by sqrt(d_model) in forward */
    nb_tensor *pe;                     /* (max_len, d_model), not a parameter */
    nb_EncoderLayer *encoder;          /* cfg.layers of each */
    nb_DecoderLayer *decoder;
    nb_LayerNorm encoder_norm, decoder_norm;
    nb_Linear generator;
    /* false at init; set it to have encode and decode store each layer's
     * attention weights in the layer structs (tensors of the caller's scope,
     * NULL when not kept) for pictures or inspection. */
    bool keep_attention;
} nb_Transformer;
/* Registers every parameter in ps; weights with 2+ dims get xavier-uniform
 * (as The Annotated Transformer's make_model). Free with nb_transformer_free
 * (the parameters belong to ps). 0, or -1 for a NULL argument or a bad cfg
 * (a size <= 0, heads not dividing d_model, dropout outside [0, 1]); then m
 * is freed, and parameters already registered stay in ps. */
NB_API int nb_transformer_init(nb_Transformer *m, nb_params *ps, const nb_TransformerConfig *cfg,
                               nb_rng *rng);
/* Frees m's layer arrays and positional table, not the parameters; NULL is ok. */
NB_API void nb_transformer_free(nb_Transformer *m);
/* src NB_I64 (B, Ls), Ls <= max_len, src_keep (B,1,1,Ls) or NULL
 * -> memory (B, Ls, d_model). Dropout only when training, from rng (NULL = global). */
NB_API nb_tensor *nb_transformer_encode(nb_Transformer *m, nb_tensor *src, nb_tensor *src_keep,
                                        bool training, nb_rng *rng);
/* memory and src_keep as from/to encode; tgt NB_I64 (B, Lt), Lt <= max_len,
 * tgt_keep (Lt,Lt) or (B,1,Lt,Lt) or NULL -> (B, Lt, d_model) */
NB_API nb_tensor *nb_transformer_decode(nb_Transformer *m, nb_tensor *memory,
                                        nb_tensor *src_keep, nb_tensor *tgt,
                                        nb_tensor *tgt_keep, bool training, nb_rng *rng);
/* (B, L, d_model) -> logits (B, L, tgt_vocab) */
NB_API nb_tensor *nb_transformer_logits(nb_Transformer *m, nb_tensor *x);

/* ------------------------------------------ nn: GPT, a decoder-only model */
/* GPT-2 as nanoGPT writes it: token and learned position embeddings, n_layer
 * pre-LN blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) with causal
 * multi-head self-attention (q, k, v from one (3C, C) projection, split with
 * nb_narrow + nb_view + nb_transpose, then nb_attention) and an MLP
 * c_proj(gelu_tanh(c_fc(x))) of width 4C, a final layer norm (eps 1e-5) and
 * lm_head, which shares wte's weight when tied (its gradient is the sum of
 * both uses). Parameter names are nanoGPT's state_dict keys, (out, in)
 * weights: transformer.wte.weight, transformer.wpe.weight,
 * transformer.h.{i}.ln_1.weight, .ln_1.bias, .attn.c_attn.weight,
 * .attn.c_attn.bias, .attn.c_proj.weight, .attn.c_proj.bias, .ln_2.weight,
 * .ln_2.bias, .mlp.c_fc.weight, .mlp.c_fc.bias, .mlp.c_proj.weight,
 * .mlp.c_proj.bias, transformer.ln_f.weight, transformer.ln_f.bias, and
 * lm_head.weight only when untied. */
typedef struct nb_GPTConfig {
    int64_t vocab_size; /* tokens: GPT-2 50257 */
    int64_t block_size; /* longest context (rows of wpe): GPT-2 1024 */
    int64_t n_layer, n_head, n_embd; /* GPT-2 124M: 12, 12, 768 */
    double dropout;     /* on embeddings, attention weights and residual branches */
    bool bias;          /* biases in the linear layers (GPT-2: true) */
    bool tie_weights;   /* lm_head.weight is transformer.wte.weight (GPT-2: true) */
} nb_GPTConfig;
/* The exact GPT-2 124M. */
#define NB_GPT2_CONFIG                                                                \
    {.vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768, \
     .dropout = 0.0, .bias = true, .tie_weights = true}
typedef struct nb_GPTBlock {
    nb_LayerNorm ln_1, ln_2;
    nb_Linear c_attn;    /* attn.c_attn: (3C, C), rows q, k, v */
    nb_Linear attn_proj; /* attn.c_proj: (C, C) */
    nb_Linear c_fc;      /* mlp.c_fc: (4C, C) */
    nb_Linear mlp_proj;  /* mlp.c_proj: (C, 4C) */
} nb_GPTBlock;
typedef struct nb_GPT {
    nb_GPTConfig cfg;
    nb_params *ps;        /* the registry the parameters were made in (borrowed) */
    nb_Embedding wte, wpe;
    nb_GPTBlock *h;       /* cfg.n_layer blocks */
    nb_LayerNorm ln_f;
    nb_Linear lm_head;    /* (vocab_size, C), no bias; weight == wte.weight when tied */
    struct nb_gpt_cache *cache; /* generation's key/value cache (internal), or NULL */
    /* Activation checkpointing (set it after nb_gpt_init; false by default):
     * with grad mode on, each block runs under nb_checkpoint, so a forward
     * keeps only the blocks' inputs and backward runs each block again. The
     * same gradients, bit for bit, in a fraction of the memory. A backward
     * reads the rng of its forward's call: it must still be alive then. */
    bool checkpoint;
    struct nb_gpt_block_ctx *block_ctx; /* internal: the checkpointed blocks' contexts */
} nb_GPT;
/* Makes every parameter in ps with GPT-2's initialisation: linear weights
 * and embeddings N(0, 0.02), the residual projections (attn.c_proj,
 * mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, layer norms 1 and 0.
 * 0, or -1 for a NULL argument or a bad cfg (a size <= 0, n_head not
 * dividing n_embd, dropout outside [0, 1]); on error m is freed and what was
 * registered stays in ps. Free with nb_gpt_free (the parameters are ps's). */
NB_API int nb_gpt_init(nb_GPT *m, nb_params *ps, const nb_GPTConfig *cfg, nb_rng *rng);
/* The blocks and the cache, not the parameters; NULL ok. Called from the
 * on_token of a generation from m, it is deferred: generation stops with an
 * error and m is freed when nb_gpt_generate returns. */
NB_API void nb_gpt_free(nb_GPT *m);
/* idx NB_I64 (B, T), T <= block_size, tokens in [0, vocab_size) -> logits
 * (B, T, vocab_size). Dropout only when training, from rng (NULL = global). */
NB_API nb_tensor *nb_gpt_forward(nb_GPT *m, nb_tensor *idx, bool training, nb_rng *rng);
/* The mean cross-entropy of predicting targets (NB_I64 (B, T), each in
 * [0, vocab_size) or -1 to ignore) from idx: 0-d, as
 * nb_cross_entropy(nb_gpt_forward(...) viewed (B*T, V), targets viewed (B*T), -1, 0). */
NB_API nb_tensor *nb_gpt_loss(nb_GPT *m, nb_tensor *idx, nb_tensor *targets, bool training,
                              nb_rng *rng);
/* Weight decay for nanoGPT/minGPT-style training: wd on the four linear
 * weights of every block (and lm_head.weight when untied), 0 on biases,
 * layer norms and embeddings (wte, so also a tied lm_head, and wpe). opt
 * must have been made from m's registry. 0 or -1. */
NB_API int nb_gpt_set_weight_decay(const nb_GPT *m, nb_optim *opt, double weight_decay);
/* Whether nb_gpt_set_weight_decay decays m's parameter `name`: 1 (a linear
 * weight), 0 (another parameter of m's registry), or -1 with a message (no
 * such parameter). For an optimizer over part of the model, e.g. a ZeRO-1
 * shard (nabla_mpi.h), which nb_gpt_set_weight_decay refuses. */
NB_API int nb_gpt_decays(const nb_GPT *m, const char *name);
/* Sampling options of nb_gpt_generate. */
typedef struct nb_gpt_sample_opts {
    double temperature; /* > 0; logits are divided by it (1 = as the model says) */
    int64_t top_k;      /* keep the k most likely tokens; 0 = all */
    bool greedy;        /* take the most likely token (temperature and top_k unused) */
    /* The linear layers' weights (lm_head included) as read: 0 or NB_F32 as
     * the model has them; NB_BF16 from bf16 copies (rounded to nearest even),
     * with bf16 products and f32 sums as under nb_autocast_begin(NB_BF16), the
     * activations rounded to bf16 as they enter each product; about half the
     * bytes per token, so about twice the tokens/s where memory bandwidth is
     * the limit. Everything else (layer norms, attention, softmax) stays f32.
     * The logits differ from f32's by about bf16's precision (relative 2^-8
     * per operand): greedy tokens mostly agree, not always. The copies (half
     * the model's size) are made at the first bf16 generation and kept in the
     * model's cache until nb_gpt_free, and made again when a weight was
     * written since (nb_write_version: a training step, a load, nb_copy_into,
     * nb_mark_modified; write through nb_data only with nb_mark_modified, as
     * autograd also asks). An f32 model only. */
    nb_dtype dtype;
} nb_gpt_sample_opts;
/* Continues prompt[0..n_prompt) (n_prompt >= 1 tokens) by n_new tokens
 * written to out[0..n_new), one sequence, with grad mode off. Keys and values
 * of past positions are kept in a cache (per layer, (1, H, block_size, D)),
 * so each new token costs one position's forward and attention over the
 * tokens so far: O(T), not O(T^2). A prompt longer than block_size keeps
 * its last block_size tokens. When the context is full, the last
 * block_size/2 tokens (at least 1) are re-encoded from position 0 and
 * generation goes on, so the context holds between block_size/2 and
 * block_size tokens (nanoGPT crops to the last block_size tokens for every
 * new token instead, a whole-block forward per token). Draws from rng (NULL = global) through nb_multinomial.
 * opts NULL = temperature 1, top_k 0 (top_k is not checked when greedy). A
 * temperature so small that the logits overflow is an error naming it.
 * on_token (may be NULL) is called after each token with it and user, and
 * may stop generation by returning false (the callback rule holds; see
 * "callbacks"). out (may be NULL when on_token takes the tokens) gets them
 * too. Memory does not grow with n_new: n_new = INT64_MAX means "until
 * on_token stops". Returns the number of tokens made, or -1 with a message
 * (tokens made before stay in out). The cache is
 * m's: one generation at a time per model (two threads need two models). */
NB_API int64_t nb_gpt_generate(nb_GPT *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                               const nb_gpt_sample_opts *opts, nb_rng *rng, int64_t *out,
                               bool (*on_token)(int64_t token, void *user), void *user);

/* ------------------------------- nn: GPT checkpoints of llm.c and Hugging Face */
/* Each load reads and checks the whole file before it writes any parameter:
 * a file that is not of the format, of another version, truncated or
 * longer, or whose sizes do not fit m's config is refused with a message
 * naming the path and the first problem, and m is left untouched. 0 or -1.
 *
 * llm.c's checkpoint (karpathy/llm.c train_gpt2.c, e.g. gpt2_124M.bin): a
 * header of 256 little-endian int32 (magic 20240326, version 3, max_seq_len,
 * vocab_size, num_layers, num_heads, channels, padded_vocab_size), then f32
 * tensors in this order: wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C),
 * qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C),
 * ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C),
 * fcprojb (L, C), lnfw (C), lnfb (C); weights (out, in). Rows V..Vp-1 of wte
 * are padding: ignored on load, written as zeros (Vp = V rounded up to a
 * multiple of 128) on save. The format is tied and has biases: loading into
 * an untied model copies wte into lm_head; a model without biases is refused;
 * saving an untied model is refused. */
NB_API int nb_gpt_load_llmc(nb_GPT *m, const char *path);
NB_API int nb_gpt_save_llmc(const nb_GPT *m, const char *path);
/* Hugging Face's GPT-2 model.safetensors (GPT2Model / GPT2LMHeadModel):
 * wte.weight, wpe.weight, h.{i}.ln_1.weight, h.{i}.ln_1.bias,
 * h.{i}.attn.c_attn.weight (C, 3C), h.{i}.attn.c_attn.bias,
 * h.{i}.attn.c_proj.weight (C, C), ..., h.{i}.mlp.c_fc.weight (C, 4C),
 * h.{i}.mlp.c_proj.weight (4C, C), ln_f.weight, ln_f.bias: Conv1D weights
 * are (in, out), transposed on the way in and out. Names may carry the prefix
 * "transformer."; the attention-mask buffers h.{i}.attn.bias and
 * h.{i}.attn.masked_bias are ignored; lm_head.weight is read when m is untied
 * (a file without it is tied: an untied m gets a copy of wte, as from llm.c)
 * and ignored when m is tied. Tensors F32 (or F64, converted). A head count
 * the file stores (its __metadata__, or else a config.json beside it; see
 * nb_gpt_config_of_file) must be m's. Saving writes what
 * GPT2LMHeadModel.save_pretrained does: "transformer." names, lm_head.weight
 * only when untied, no mask buffers, the model's dtype; and the config in
 * __metadata__ ("n_layer", "n_head", "n_embd", "vocab_size", "block_size",
 * decimal strings), so that the file rebuilds the same model. */
NB_API int nb_gpt_load_hf(nb_GPT *m, const char *path);
NB_API int nb_gpt_save_hf(const nb_GPT *m, const char *path);
/* The config stored in a file of either format (told apart by llm.c's magic):
 * llm.c: its header; Hugging Face: the sizes from the tensors' shapes,
 * tie_weights unless the file has lm_head.weight, bias unless the file has
 * no linear biases, and n_head, which no shape shows, from (in this order)
 * the file's __metadata__ (nb_gpt_save_hf writes "n_layer", "n_head",
 * "n_embd", "vocab_size" and "block_size" there), a config.json in the
 * file's folder (Hugging Face's: n_head, and n_layer, n_embd, vocab_size,
 * n_positions; used when it is JSON with an integer n_head), or else a guess:
 * n_embd / 64 (every GPT-2 size has heads of 64; 1 when 64 does not divide
 * n_embd). Sizes stored there that contradict the tensors, or an n_head
 * that does not divide n_embd, are refused. dropout 0. 0 or -1.
 * nb_gpt_inspect also tells where n_head came from: tell the user when it
 * was a guess (a model run with the wrong head count computes something
 * else, silently). */
NB_API int nb_gpt_config_of_file(const char *path, nb_GPTConfig *cfg);
typedef enum nb_gpt_n_head_from {
    NB_GPT_N_HEAD_FILE = 0,    /* llm.c's header, or the safetensors' __metadata__ */
    NB_GPT_N_HEAD_CONFIG_JSON, /* config.json in the file's folder */
    NB_GPT_N_HEAD_GUESSED      /* nowhere: n_embd / 64 (or 1) */
} nb_gpt_n_head_from;
NB_API int nb_gpt_inspect(const char *path, nb_GPTConfig *cfg, nb_gpt_n_head_from *from);
/* The model a file of either format holds, made in ps and loaded: as
 * nb_gpt_config_of_file, nb_gpt_init and nb_gpt_load_llmc / _hf, without
 * drawing initial weights the load overwrites (GPT-2 124M: seconds saved).
 * 0, or -1 (m freed; parameters registered before the failure stay in ps). */
NB_API int nb_gpt_from_file(nb_GPT *m, nb_params *ps, const char *path);
/* A token file as a 1-D NB_I64 tensor (persistent: nb_free it): llm.c's
 * (a header of 256 int32, magic 20240520, version 1, the token count, then
 * that many uint16 tokens, nothing after), or else any file's bytes, one
 * token per byte (0..255). With vocab_size > 0, a token >= vocab_size is an
 * error naming its position. An empty file is an error. */
NB_API nb_tensor *nb_load_tokens(const char *path, int64_t vocab_size);
/* An IDX file (MNIST's and Fashion-MNIST's format, uncompressed: bytes 0 0,
 * a type byte (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64), the
 * number of dims, big-endian u32 sizes, then the data, nothing after) as a
 * persistent tensor of dtype (NB_F32, NB_F64 or NB_I64; a value dtype cannot
 * hold exactly is an error). Errors name the file and the first problem: a
 * wrong magic, a truncated file, bytes left over. */
NB_API nb_tensor *nb_load_idx(const char *path, nb_dtype dtype);

/* ---------------------------------------------------- nn: GPT-2 tokenizer */
/* GPT-2's byte-level BPE (OpenAI's encoder.py, exactly; docs/tokenizer.md):
 * any bytes in, token ids out, and back. A loaded tokenizer is read-only:
 * any number of threads may encode and decode with it at once. */
typedef struct nb_tokenizer nb_tokenizer; /* opaque */
/* path: a Hugging Face tokenizer.json; a vocab.json (merges.txt beside it);
 * an OpenAI encoder.json (vocab.bpe beside it); or llm.c's
 * gpt2_tokenizer.bin (decoding only). The caller's, freed by
 * nb_tokenizer_free. NULL + a message naming the file (and line) and the
 * first problem: not JSON, ids not 0..n-1 each once, a token twice, a merge
 * whose parts or result are not in the vocabulary, no merges file, ... */
NB_API nb_tokenizer *nb_tokenizer_load(const char *path);
NB_API void nb_tokenizer_free(nb_tokenizer *tok); /* NULL is ok */
NB_API int64_t nb_tokenizer_vocab_size(const nb_tokenizer *tok); /* 50257 for GPT-2 */
NB_API int64_t nb_tokenizer_eot(const nb_tokenizer *tok); /* id of <|endoftext|>, or -1 */
/* false for gpt2_tokenizer.bin (it has no merges) or a NULL tok */
NB_API bool nb_tokenizer_can_encode(const nb_tokenizer *tok);
/* Encodes len bytes of text (any bytes: a byte that is not part of valid
 * UTF-8 is a character of its own, neither letter, number nor space);
 * "<|endoftext|>" in the text is the special token, as Hugging Face's
 * GPT2Tokenizer reads it. Returns how many ids the whole text encodes to
 * (never more than len) and writes the first min(that, cap) to ids
 * (snprintf-style: cap 0 and ids NULL count), or -1. Sets no error on success. */
NB_API int64_t nb_tokenizer_encode(const nb_tokenizer *tok, const char *text, int64_t len,
                                   int64_t *ids, int64_t cap);
/* Writes the bytes of ids[0..n) to out (at most cap; not NUL-terminated) and
 * returns the total byte count (snprintf-style), or -1 with a message naming
 * the first id out of [0, vocab_size) and its position (nothing written). */
NB_API int64_t nb_tokenizer_decode(const nb_tokenizer *tok, const int64_t *ids, int64_t n,
                                   char *out, int64_t cap);
/* The bytes of one token (borrowed from tok, not NUL-terminated; *len set),
 * or NULL + message: for streaming output a token at a time. A token may
 * hold part of a UTF-8 character (GPT-2 splits some across tokens). */
NB_API const char *nb_tokenizer_token(const nb_tokenizer *tok, int64_t id, int64_t *len);

/* -------------------------------------------- nn: optimizers and schedules */
/* Optimizers: state is allocated at creation; step reads each parameter's
 * .grad (parameters without one are skipped) and updates it in place.
 * Creation also faults in one buffer of each parameter's size and leaves it
 * in the allocator's cache (nb_memory_cached; nb_empty_cache returns them),
 * where the first backward finds its gradients' buffers: so the first step
 * does not pay for fresh pages (skipped when the cache has no room).
 * An optimizer uses the parameters ps has when it is made (at least one, all
 * floating and contiguous); it is the caller's, freed by nb_optim_free. NULL
 * on error, e.g. lr, momentum, eps or weight_decay < 0 or a beta not in [0, 1). */
/* torch.optim.SGD (dampening 0, no nesterov) */
NB_API nb_optim *nb_sgd(nb_params *ps, double lr, double momentum, double weight_decay);
/* torch.optim.Adam (L2 weight decay added to the gradient) */
NB_API nb_optim *nb_adam(nb_params *ps, double lr, double beta1, double beta2, double eps,
                         double weight_decay);
/* torch.optim.AdamW (decoupled weight decay) */
NB_API nb_optim *nb_adamw(nb_params *ps, double lr, double beta1, double beta2, double eps,
                          double weight_decay);
/* One update. A parameter whose .grad does not match it (dtype, numel,
 * contiguity) is skipped with a message. A graph that saved a parameter can
 * no longer backpropagate (as after nb_mark_modified). */
NB_API void nb_optim_step(nb_optim *opt);
NB_API void nb_optim_zero_grad(nb_optim *opt);          /* nb_zero_grad on each parameter */
/* nb_clear_grad on each parameter: PyTorch's zero_grad(set_to_none=True), the
 * faster way to end a training step (no pass over the gradients, which then
 * take no memory during the next forward). */
NB_API void nb_optim_clear_grad(nb_optim *opt);
NB_API void nb_optim_set_lr(nb_optim *opt, double lr);  /* lr >= 0, else an error, unchanged */
/* Per-parameter weight decay, as PyTorch's parameter groups: the parameter
 * registered as name in the optimizer's registry (NULL = every parameter)
 * gets weight_decay (>= 0) instead of the optimizer's. 0, or -1 (unknown
 * name, bad value; nothing changed). */
NB_API int nb_optim_set_weight_decay(nb_optim *opt, const char *name, double weight_decay);
/* That parameter's weight decay; NULL: the optimizer's own (the value given
 * at creation, or the last one set for every parameter); NaN on error. */
NB_API double nb_optim_weight_decay(const nb_optim *opt, const char *name);
NB_API double nb_optim_lr(const nb_optim *opt);         /* NaN on NULL */
NB_API void nb_optim_free(nb_optim *opt);               /* with its state; NULL is ok */
/* The optimizer's state as a registry of buffers owned by opt (valid until
 * nb_optim_free): for each parameter "<name>.step" (NB_I64, 0-d) and
 * "<name>.exp_avg", "<name>.exp_avg_sq" (Adam, AdamW) or
 * "<name>.momentum_buffer" (SGD with momentum). nb_save it next to the
 * model and nb_load it into an optimizer made the same way to resume a run
 * exactly; hyperparameters (lr, betas, ...) are not part of it.
 * nb_load refuses a state no run could have made (a step outside [0, 2^53],
 * a NaN or infinite moment, a negative exp_avg_sq), so a corrupt file cannot
 * turn every weight to NaN at the next step. */
NB_API nb_params *nb_optim_state(nb_optim *opt);
/* Scales all gradients so that their joint L2 norm is at most max_norm, as
 * torch.nn.utils.clip_grad_norm_; returns the norm before clipping (0 when no
 * parameter has a .grad), or -1.0 on error (NULL registry, max_norm < 0 or
 * NaN, a non-contiguous .grad; then nothing is scaled). */
NB_API double nb_clip_grad_norm(nb_params *ps, double max_norm);
/* The Annotated Transformer's schedule: factor * d_model^-0.5 *
 * min(step^-0.5, step * warmup^-1.5), with step 0 counted as 1; warmup 0
 * means none. -1.0 on error (step < 0, d_model <= 0, warmup < 0, factor < 0
 * or NaN). */
NB_API double nb_noam_rate(int64_t step, int64_t d_model, double factor, int64_t warmup);

/* Learning-rate schedules (nn/train/schedule.c): pure functions of the step,
 * so a resumed run gets the rate it would have had; set it each step with
 * nb_optim_set_lr(opt, nb_lr_...(step, ...)). step is PyTorch's last_epoch:
 * 0 for the first optimizer step, one more per scheduler.step(). Each
 * returns -1.0 on a bad argument, with a message naming the function, the
 * argument and its value (negative step or size, NaN, infinite or negative
 * rate or factor, a floor above lr, a factor outside PyTorch's range).
 * They agree with PyTorch 1.13's schedulers stepped once per step to about
 * 1e-14 relative (PyTorch computes most of them recursively, the new rate
 * from the old; these are the closed forms). */

/* nanoGPT's get_lr: lr * (step + 1) / (warmup + 1) while step < warmup;
 * then min_lr + (lr - min_lr) * (1 + cos(pi * (step - warmup) / (total -
 * warmup))) / 2 up to step total; min_lr after. When total <= warmup there
 * is no cosine: min_lr from step warmup on. Needs min_lr <= lr. */
NB_API double nb_lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr);
/* torch.optim.lr_scheduler.CosineAnnealingLR(T_max=t_max, eta_min): eta_min
 * + (lr - eta_min) * (1 + cos(pi * step / t_max)) / 2, rising again past
 * t_max as PyTorch's does. t_max > 0; needs eta_min <= lr (PyTorch accepts
 * a larger eta_min: it anneals upwards). */
NB_API double nb_lr_cosine_annealing(int64_t step, int64_t t_max, double lr, double eta_min);
/* StepLR(step_size, gamma): lr * gamma^floor(step / step_size); step_size
 * > 0, gamma >= 0 (-1.0 too when the rate overflows, gamma > 1). */
NB_API double nb_lr_step(int64_t step, int64_t step_size, double gamma, double lr);
/* ExponentialLR(gamma): lr * gamma^step; gamma >= 0 (-1.0 too when the rate
 * overflows, gamma > 1). */
NB_API double nb_lr_exponential(int64_t step, double gamma, double lr);
/* LinearLR(start_factor, end_factor, total_iters): lr * (start_factor +
 * (end_factor - start_factor) * min(step, total_iters) / total_iters), so
 * end_factor * lr from total_iters on. start_factor in (0, 1] (PyTorch 2's
 * check: 1.13 accepts 0, then divides by zero), end_factor in [0, 1],
 * total_iters > 0. */
NB_API double nb_lr_linear(int64_t step, double start_factor, double end_factor,
                           int64_t total_iters, double lr);
/* OneCycleLR(max_lr, total_steps, pct_start, anneal_strategy 'cos' when
 * cos_anneal else 'linear', div_factor, final_div_factor, three_phase)'s
 * learning rate: from max_lr / div_factor up to max_lr over the first
 * pct_start * total_steps - 1 steps, (three_phase: back down as long,) then
 * to max_lr / div_factor / final_div_factor at step total_steps - 1. Step
 * total_steps (the last scheduler.step() of a run) extrapolates as PyTorch
 * does (refused where linear annealing takes it below 0); later steps are
 * refused, as PyTorch raises. pct_start in [0, 1],
 * div_factor and final_div_factor > 0; a step landing in a phase of no
 * length (where PyTorch divides by zero, e.g. pct_start * total_steps = 1)
 * is refused. PyTorch's defaults: pct_start 0.3, div_factor 25,
 * final_div_factor 1e4, three_phase false, cos_anneal true. */
NB_API double nb_lr_one_cycle(int64_t step, int64_t total_steps, double max_lr, double pct_start,
                              double div_factor, double final_div_factor, bool three_phase,
                              bool cos_anneal);

#ifdef __cplusplus
}
#endif
#endif /* NABLA_H */
