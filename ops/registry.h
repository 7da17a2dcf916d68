/* registry.h: every op of nabla, declared once.
 *
 * Adding an op is: one line here, its forward kernel and backward rule in
 * its family file (ops/<family>.c, the list it sits in), its prototype in
 * nabla.h, and its fixtures from tests/fixtures/gen_edges.py. Everything
 * else is made from these lists:
 *   - the dispatch enums of the elementwise and binary kernels (and which
 *     ops are cheap enough for the large thread grain);
 *   - the per-op tests (tests/test_registry.c: PyTorch fixtures present,
 *     gradcheck on contiguous, transposed and broadcast inputs, bitwise
 *     identity across thread counts, inputs and output freed before
 *     backward; tests/test_edges.c: edge values against PyTorch);
 *   - the op fuzzer's opcodes (fuzz/fuzz_ops.c, fuzz/gen_seeds.c);
 *   - the op tables of docs/ops.md and README.md (make op-table writes them;
 *     the registry suite of make test fails when they differ).
 *
 * A line is X(name, inputs, flags, call):
 *   name    the public function is nb_<name>
 *   inputs  one word per tensor input, as the generic tests make them:
 *           a letter, then optionally ":" and a shape (default 3x4)
 *             f floating       p floating > 0       a floating, |x| >= 0.5
 *             b bool           i int64 index in [0, 3)
 *           then optionally "=": its dim 0 does not grow (see call; a
 *           per-channel weight), and "?N": an optional input (NULL
 *           accepted, the registry suite checks that it gives a result),
 *           which the op's messages call input N (its argument position)
 *   flags   NB_OP_DIFF   differentiable in its floating inputs
 *           NB_OP_EXACT  bit for bit PyTorch's result, sign of zero included
 *                        (else within the tolerance of docs/numerics.md)
 *           NB_OP_CHEAP  an elementwise kernel cheap enough for the large
 *                        thread grain (NBI_GRAIN rather than NBI_GRAIN_HEAVY)
 *           NB_OP_BF16   takes NB_BF16 inputs (a bf16 kernel, or a copy that
 *                        moves 2-byte elements); every other op refuses bf16
 *                        with a message naming it (test_registry.c checks
 *                        both, against the op in f32 on bf16-rounded inputs)
 *           NB_OP_GRAD2  twice differentiable: under create_graph its backward
 *                        is made of recorded ops (test_registry.c runs
 *                        nb_gradgradcheck on the three layouts)
 *           NB_OP_JVP    has a tangent rule (nbi_node.jvp) for forward mode
 *                        (test_registry.c runs nb_gradcheck with
 *                        check_forward_ad); every NB_OP_DIFF op must have
 *                        both, and the suite says which lacks one. The two
 *                        go together: the engine refuses create_graph
 *                        through a node without a tangent rule, by name,
 *                        rather than take a fused gradient with no graph
 *   call    the call the tests and the fuzzer's seeds make, on inputs x[0..]
 *           (x is nb_tensor **; op_rng() is the includer's seeded generator).
 *           It must stay valid when dim 0 of every input grows (the thread
 *           tests multiply it to reach the parallel paths): hence -1 sizes.
 *
 * This header includes nothing: include nabla.h first and define X. */
#ifndef NABLA_OPS_REGISTRY_H
#define NABLA_OPS_REGISTRY_H

#define NB_OP_DIFF 1u
#define NB_OP_EXACT 2u
#define NB_OP_CHEAP 4u
#define NB_OP_BF16 8u
#define NB_OP_GRAD2 16u
#define NB_OP_JVP 32u

/* ops/elementwise.c: one input and up to two scalars; kernel enum U_<name> */
#define NB_OPS_ELEMENTWISE(X)                                                        \
    X(neg, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,    \
      nb_neg(x[0]))                                                                  \
    X(exp, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_exp(x[0]))                  \
    X(log, "p", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_log(x[0]))                  \
    X(sqrt, "p", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP, nb_sqrt(x[0]))  \
    X(tanh, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_tanh(x[0]))                \
    X(relu, "a", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,   \
      nb_relu(x[0]))                                                                 \
    X(gelu, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_gelu(x[0]))                \
    X(pow_scalar, "p", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                         \
      nb_pow_scalar(x[0], 1.5))                                                      \
    X(add_scalar, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_add_scalar(x[0], 1.5))                                                      \
    X(mul_scalar, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_mul_scalar(x[0], -2.5))                                                     \
    X(sigmoid, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_sigmoid(x[0]))          \
    X(silu, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_silu(x[0]))                \
    X(abs, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,    \
      nb_abs(x[0]))                                                                  \
    X(clamp, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_clamp(x[0], -0.5, 0.8))                                                     \
    X(gelu_tanh, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_gelu_tanh(x[0]))     \
    X(sin, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_sin(x[0]))                  \
    X(cos, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_cos(x[0]))

/* ops/binary.c: two broadcast inputs; kernel enum NBI_<name> */
#define NB_OPS_BINARY(X)                                                             \
    X(add, "f f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_add(x[0], x[1]))                                                            \
    X(sub, "f f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_sub(x[0], x[1]))                                                            \
    X(mul, "f f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_mul(x[0], x[1]))                                                            \
    X(div, "f a", NB_OP_DIFF | NB_OP_EXACT | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_div(x[0], x[1]))                                                            \
    X(minimum, "f f", NB_OP_DIFF | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,            \
      nb_minimum(x[0], x[1]))                                                        \
    X(maximum, "f f", NB_OP_DIFF | NB_OP_CHEAP | NB_OP_GRAD2 | NB_OP_JVP,            \
      nb_maximum(x[0], x[1]))

/* ops/compare.c: boolean results, and where */
#define NB_OPS_COMPARE(X)                                                            \
    X(eq, "f f", NB_OP_EXACT, nb_eq(x[0], x[1]))                                     \
    X(ne, "f f", NB_OP_EXACT, nb_ne(x[0], x[1]))                                     \
    X(lt, "f f", NB_OP_EXACT, nb_lt(x[0], x[1]))                                     \
    X(gt, "f f", NB_OP_EXACT, nb_gt(x[0], x[1]))                                     \
    X(logical_not, "b", NB_OP_EXACT, nb_logical_not(x[0]))                           \
    X(where, "b f f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,            \
      nb_where(x[0], x[1], x[2]))

/* ops/reduce.c */
#define NB_OPS_REDUCE(X)                                                             \
    X(sum, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_sum(x[0], 1, false))        \
    X(mean, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_mean(x[0], 0, true))       \
    X(max, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,                  \
      nb_max(x[0], 1, false))                                                        \
    X(argmax, "f", NB_OP_EXACT, nb_argmax(x[0], 0, false))                           \
    X(sum_all, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_sum_all(x[0]))          \
    X(mean_all, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_mean_all(x[0]))        \
    X(min, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,                  \
      nb_min(x[0], 1, false))                                                        \
    X(sum_dims, "f:2x3x4", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                     \
      nb_sum_dims(x[0], 2, (const int[]){1, 2}, true))                               \
    X(mean_dims, "f:2x3x4", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                    \
      nb_mean_dims(x[0], 2, (const int[]){-1, 1}, false))                            \
    X(var, "f:2x3x4", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                          \
      nb_var(x[0], 2, (const int[]){1, 2}, 1.0, false))                              \
    X(std, "f:2x3x4", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                          \
      nb_std(x[0], 1, (const int[]){-1}, 0.0, true))                                 \
    X(cumsum, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,               \
      nb_cumsum(x[0], 1))

/* ops/matmul.c */
#define NB_OPS_MATMUL(X)                                                             \
    X(matmul, "f:2x3x4 f:2x4x5", NB_OP_DIFF | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_matmul(x[0], x[1]))

/* ops/softmax.c */
#define NB_OPS_SOFTMAX(X)                                                            \
    X(softmax, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, nb_softmax(x[0], 1))       \
    X(log_softmax, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                        \
      nb_log_softmax(x[0], 0))

/* ops/masked_fill.c */
#define NB_OPS_MASKED_FILL(X)                                                        \
    X(masked_fill, "f b", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,        \
      nb_masked_fill(x[0], x[1], -2))

/* ops/dropout.c */
#define NB_OPS_DROPOUT(X)                                                            \
    X(dropout, "f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                          \
      nb_dropout(x[0], 0.25, true, op_rng()))

/* ops/batch_norm.c: statistics per channel (dim 1) over dims 0 and 2.., so
 * dim 0 may grow; weight and bias (C) keep their size. The running
 * statistics are state, not inputs (tests/test_batchnorm.c). */
#define NB_OPS_BATCH_NORM(X)                                                         \
    X(batch_norm, "f:4x3x2 f:3=?3 f:3=?4", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,     \
      nb_batch_norm(x[0], NULL, NULL, x[1], x[2], true, 0.1, 1e-5))

/* ops/loss.c: the registry's pos_weight has the input's shape (dim 0 grows) */
#define NB_OPS_LOSS(X)                                                               \
    X(mse_loss, "f f", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,                         \
      nb_mse_loss(x[0], x[1], NB_REDUCTION_MEAN))                                    \
    X(binary_cross_entropy_with_logits, "f f p?3", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_binary_cross_entropy_with_logits(x[0], x[1], NULL, x[2], NB_REDUCTION_SUM))

/* ops/view.c: views (no copy) and reshape/contiguous */
#define NB_OPS_VIEW(X)                                                               \
    X(view, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP,    \
      nb_view(x[0], NB_SHAPE(-1, 1, 4)))                                             \
    X(reshape, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_reshape(x[0], NB_SHAPE(-1, 6)))                                             \
    X(transpose, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_transpose(x[0], 0, 1))                                                      \
    X(permute, "f:2x3x4", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_permute(x[0], 3, (const int[]){2, 0, 1}))                                   \
    X(unsqueeze, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_unsqueeze(x[0], 1))                                                         \
    X(squeeze, "f:3x1x4", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_squeeze(x[0], 1))                                                           \
    X(expand, "f:3x1", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_expand(x[0], NB_SHAPE(2, -1, 4)))                                           \
    X(narrow, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_narrow(x[0], 1, 1, 2))                                                      \
    X(select, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP,  \
      nb_select(x[0], 0, -1))                                                        \
    X(contiguous, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_contiguous(x[0]))

/* ops/shape.c: copies that move elements */
#define NB_OPS_SHAPE(X)                                                              \
    X(cat, "f f:2x4", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_cat(x, 2, 0))                                                               \
    X(stack, "f f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP, \
      nb_stack(x, 2, 1))                                                             \
    X(to, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_BF16 | NB_OP_GRAD2 | NB_OP_JVP,      \
      nb_to(x[0], NB_F64))

/* ops/index.c */
#define NB_OPS_INDEX(X)                                                              \
    X(gather, "f i:3x2", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,         \
      nb_gather(x[0], 1, x[1]))                                                      \
    X(index_select, "f i:5", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,     \
      nb_index_select(x[0], 0, x[1]))

/* ops/sort.c: along dim 1 (dim 0 grows in the thread tests) */
#define NB_OPS_SORT(X)                                                               \
    X(sort, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,                 \
      nb_sort(x[0], 1, true, NULL))                                                  \
    X(topk, "f", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,                 \
      nb_topk(x[0], 2, 1, true, true, NULL))

/* ops/sample.c: random draws by weight */
#define NB_OPS_SAMPLE(X) X(multinomial, "p", 0, nb_multinomial(x[0], 3, true, op_rng()))

/* ops/pool.c: (N, C, H, W) and (N, C, L) pooling; N grows in the thread tests */
#define NB_OPS_POOL(X)                                                               \
    X(max_pool2d, "f:2x2x5x4", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,   \
      nb_max_pool2d(x[0], (const int64_t[]){3, 2}, (const int64_t[]){2, 1},         \
                    (const int64_t[]){1, 1}))                                        \
    X(avg_pool2d, "f:2x2x5x4", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,   \
      nb_avg_pool2d(x[0], (const int64_t[]){3, 2}, (const int64_t[]){2, 1},         \
                    (const int64_t[]){1, 1}, true))                                  \
    X(max_pool1d, "f:2x3x5", NB_OP_DIFF | NB_OP_EXACT | NB_OP_GRAD2 | NB_OP_JVP,     \
      nb_max_pool1d(x[0], 3, 2, 1))

/* ops/conv.c (bias: tests/test_conv.c): unbatched inputs whose dim 0 (channels)
 * grows with the weight's (out channels); groups read from the input keep 2 channels
 * per group in and out, so the grown call stays valid and linear in size */
#define NB_OPS_CONV(X)                                                               \
    X(conv2d, "f:4x5x5 f:4x2x3x2", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,         \
      nb_conv2d(x[0], x[1], NULL, (const int64_t[]){2, 1}, (const int64_t[]){1, 0},  \
                (const int64_t[]){1, 2}, nb_ndim(x[0]) > 0 ? nb_shape(x[0])[0] / 2 : 1)) \
    X(conv1d, "f:4x5 f:4x2x3", NB_OP_DIFF | NB_OP_GRAD2 | NB_OP_JVP,             \
      nb_conv1d(x[0], x[1], NULL, 1, NB_PADDING_SAME, 2,                             \
                nb_ndim(x[0]) > 0 ? nb_shape(x[0])[0] / 2 : 1))

/* Every op, in this order (the fuzzer's opcodes follow it). */
#define NB_OPS(X)                                                                    \
    NB_OPS_ELEMENTWISE(X) NB_OPS_BINARY(X) NB_OPS_COMPARE(X) NB_OPS_REDUCE(X)        \
    NB_OPS_MATMUL(X) NB_OPS_SOFTMAX(X) NB_OPS_MASKED_FILL(X) NB_OPS_DROPOUT(X)       \
    NB_OPS_VIEW(X) NB_OPS_SHAPE(X) NB_OPS_INDEX(X) NB_OPS_SORT(X) NB_OPS_SAMPLE(X)     \
    NB_OPS_BATCH_NORM(X) NB_OPS_LOSS(X) NB_OPS_POOL(X) NB_OPS_CONV(X)

/* Every family list with its file under ops/, for tables that name it. */
#define NB_OP_FAMILIES(F)                                                            \
    F(NB_OPS_ELEMENTWISE, "elementwise") F(NB_OPS_BINARY, "binary")                  \
    F(NB_OPS_COMPARE, "compare") F(NB_OPS_REDUCE, "reduce") F(NB_OPS_MATMUL, "matmul") \
    F(NB_OPS_SOFTMAX, "softmax") F(NB_OPS_MASKED_FILL, "masked_fill")                \
    F(NB_OPS_DROPOUT, "dropout") F(NB_OPS_VIEW, "view") F(NB_OPS_SHAPE, "shape")     \
    F(NB_OPS_INDEX, "index") F(NB_OPS_SORT, "sort") F(NB_OPS_SAMPLE, "sample")       \
    F(NB_OPS_BATCH_NORM, "batch_norm") F(NB_OPS_LOSS, "loss") F(NB_OPS_POOL, "pool") \
    F(NB_OPS_CONV, "conv")

#endif
