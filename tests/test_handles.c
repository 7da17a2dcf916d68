/* test_handles.c: freed tensor handles. Every public function that takes a
 * tensor rejects a freed one (by nb_free, by the end of its scope, or with
 * its owner) with "fn: input i was freed (...)", instead of reading freed
 * memory; one table holds those functions, and it is checked against the
 * NB_API declarations of nabla.h itself so that it cannot fall behind.
 * Then: borrowed tensors die with their owners, the quarantine keeps a
 * handle reported for 10,000 allocations, a graph still backpropagates
 * through tensors the user freed, and a thread's freed handles stay reported
 * after the thread exits. Every test ends with the tensor count and the
 * storage bytes it started with. */
#include "test_util.h"

#include "ops/registry.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef NB_FIXTURE_DIR
#define NB_FIXTURE_DIR "tests/fixtures"
#endif

/* ------------------------------------------------------------ bookkeeping */
typedef struct {
    int64_t live, bytes;
} usage;

static usage usage_now(void) { return (usage){nb_live_tensors(), nb_memory_allocated()}; }

static void expect_same_usage(usage before, const char *what) {
    ck_assert_msg(nb_live_tensors() == before.live, "%s: %lld tensor(s) left alive", what,
                  (long long)(nb_live_tensors() - before.live));
    ck_assert_msg(nb_memory_allocated() == before.bytes, "%s: %lld storage bytes left", what,
                  (long long)(nb_memory_allocated() - before.bytes));
}

static const char *msg_or_none(void) {
    return nb_last_error() ? nb_last_error() : "(no message)";
}

/* Asserts that nb_last_error() contains "<fn>: input <i> was freed (<how>"
 * and clears it. */
#define expect_freed(fn, i, how) expect_freed_at(__LINE__, (fn), (i), (how))
static void expect_freed_at(int line, const char *fn, int i, const char *how) {
    char want[256];
    snprintf(want, sizeof want, "%s: input %d was freed (%s", fn, i, how);
    const char *msg = nb_last_error();
    ck_assert_msg(msg && strstr(msg, want), "line %d: message \"%s\", expected \"%s...\"", line,
                  msg_or_none(), want);
    nb_clear_error();
}

#define BY_FREE_TEXT "by nb_free) and cannot be used"
#define BY_SCOPE_TEXT "by nb_scope_end, as its scope ended; nb_keep hands a tensor to the " \
                      "enclosing scope) and cannot be used"
#define WITH_OWNER_TEXT "with its owner: the leaf whose gradient it was, or the registry or " \
                        "optimizer that held it) and cannot be used"

/* ----------------------------------------------------------- the inputs */
static nb_tensor *made(nb_tensor *t) {
    ck_assert_msg(t != NULL, "making an input failed: %s", msg_or_none());
    return t;
}
static nb_tensor *f64(int ndim, const int64_t *shape) {
    return made(nb_full(NB_F64, ndim, shape, 0.5));
}
/* In the modules' dtype. */
static nb_tensor *fdef(int ndim, const int64_t *shape) {
    return made(nb_full(nb_default_dtype(), ndim, shape, 0.5));
}
static nb_tensor *i64(int ndim, const int64_t *shape) {
    return made(nb_zeros(NB_I64, ndim, shape));
}
static nb_tensor *keep_all(int ndim, const int64_t *shape) {
    return made(nb_ones(NB_BOOL, ndim, shape));
}
static nb_tensor *leaf(int ndim, const int64_t *shape) {
    return made(nb_set_requires_grad(f64(ndim, shape), true));
}

/* The modules the nn forwards run with: 3 -> 4 linear, 5 x 3 embedding,
 * layer norm and batch norm over 3, attention and feed-forward of d_model 4, and a tiny
 * transformer (vocabularies of 5, d_model 4). No dropout. */
static struct {
    nb_params *ps;
    nb_Linear lin;
    nb_Embedding emb;
    nb_LayerNorm ln;
    nb_BatchNorm bn;
    nb_MHA mha;
    nb_FeedForward ff;
    nb_Transformer tr;
    nb_GPT gpt;
    nb_params *gps;
    nb_RNNCell rnn, gru, lstm; /* 3 -> 4 */
    nb_Conv1d c1;              /* 2 -> 3 channels, kernel 2 */
    nb_Conv2d c2;              /* 2 -> 3 channels, kernel 2x2 */
} mods;
static const nb_TransformerConfig tiny = {.src_vocab = 5, .tgt_vocab = 5, .d_model = 4,
                                          .d_ff = 6, .heads = 2, .layers = 1, .max_len = 8,
                                          .dropout = 0.0};

static void mods_init(void) {
    nb_rng r;
    nb_rng_seed(&r, 3);
    mods.ps = nb_params_new();
    ck_assert_ptr_nonnull(mods.ps);
    ck_assert_int_eq(nb_linear_init(&mods.lin, mods.ps, "lin", 3, 4, true, &r), 0);
    ck_assert_int_eq(nb_embedding_init(&mods.emb, mods.ps, "emb", 5, 3, &r), 0);
    ck_assert_int_eq(nb_layernorm_init(&mods.ln, mods.ps, "ln", 3, 1e-5), 0);
    ck_assert_int_eq(nb_batchnorm1d_init(&mods.bn, mods.ps, "bn", 3, 1e-5, 0.1), 0);
    ck_assert_int_eq(nb_mha_init(&mods.mha, mods.ps, "mha", 4, 2, 0.0, true, &r), 0);
    ck_assert_int_eq(nb_feedforward_init(&mods.ff, mods.ps, "ff", 4, 6, 0.0, &r), 0);
    ck_assert_int_eq(nb_transformer_init(&mods.tr, mods.ps, &tiny, &r), 0);
    ck_assert_int_eq(nb_rnncell_init(&mods.rnn, mods.ps, "rnn", 3, 4, true, false, &r), 0);
    ck_assert_int_eq(nb_grucell_init(&mods.gru, mods.ps, "gru", 3, 4, true, &r), 0);
    ck_assert_int_eq(nb_lstmcell_init(&mods.lstm, mods.ps, "lstm", 3, 4, true, &r), 0);
    ck_assert_int_eq(nb_conv1d_init(&mods.c1, mods.ps, "c1", 2, 3, 2, 1, 0, 1, 1, true, &r), 0);
    ck_assert_int_eq(nb_conv2d_init(&mods.c2, mods.ps, "c2", 2, 3, (int64_t[]){2, 2}, NULL, NULL,
                                    NULL, 1, true, &r), 0);
    mods.gps = nb_params_new();
    const nb_GPTConfig g = {.vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2,
                            .n_embd = 4, .bias = true, .tie_weights = true};
    ck_assert_int_eq(nb_gpt_init(&mods.gpt, mods.gps, &g, &r), 0);
}

static void mods_free(void) {
    if (!mods.ps) return;
    nb_transformer_free(&mods.tr);
    nb_gpt_free(&mods.gpt);
    nb_params_free(mods.gps);
    nb_params_free(mods.ps);
    mods.ps = NULL;
}

/* Makers: valid inputs for one case, in the current scope, each a tensor of
 * its own (so that freeing one leaves the others live). */
#define MAX_IN 4
static void mk_one(nb_tensor **in) { in[0] = f64(NB_SHAPE(2, 3)); }
static void mk_two(nb_tensor **in) { in[0] = f64(NB_SHAPE(2, 3)), in[1] = f64(NB_SHAPE(2, 3)); }
static void mk_scalar(nb_tensor **in) { in[0] = f64(0, NULL); }
static void mk_leaf(nb_tensor **in) { in[0] = leaf(NB_SHAPE(2, 3)); }
/* a leaf that has a .grad */
static void mk_leaf_grad(nb_tensor **in) {
    in[0] = leaf(NB_SHAPE(2, 3));
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul_scalar(in[0], 2.0))), 0);
}
static void mk_loss(nb_tensor **in) {
    in[0] = made(nb_sum_all(nb_mul_scalar(leaf(NB_SHAPE(2, 3)), 2.0)));
}
static void mk_out_grad(nb_tensor **in) {
    in[0] = made(nb_mul_scalar(leaf(NB_SHAPE(2, 3)), 2.0)), in[1] = f64(NB_SHAPE(2, 3));
}
static void mk_gradcheck(nb_tensor **in) { in[0] = leaf(NB_SHAPE(3)), in[1] = leaf(NB_SHAPE(3)); }
static void mk_loss_leaf(nb_tensor **in) {
    in[1] = leaf(NB_SHAPE(3));
    in[0] = nb_sum_all(nb_mul(in[1], in[1]));
}
static void mk_linear(nb_tensor **in) {
    in[0] = f64(NB_SHAPE(2, 3)), in[1] = f64(NB_SHAPE(4, 3)), in[2] = f64(NB_SHAPE(4));
}
static void mk_embedding(nb_tensor **in) { in[0] = f64(NB_SHAPE(5, 3)), in[1] = i64(NB_SHAPE(2)); }
static void mk_layer_norm(nb_tensor **in) {
    in[0] = f64(NB_SHAPE(2, 3)), in[1] = f64(NB_SHAPE(3)), in[2] = f64(NB_SHAPE(3));
}
static void mk_cross_entropy(nb_tensor **in) {
    in[0] = f64(NB_SHAPE(2, 3)), in[1] = i64(NB_SHAPE(2));
}
static void mk_attention(nb_tensor **in) {
    for (int i = 0; i < 3; i++) in[i] = f64(NB_SHAPE(2, 3, 4));
    in[3] = made(nb_tril_mask(3, 3));
}
/* module inputs */
static void mk_x3(nb_tensor **in) { in[0] = fdef(NB_SHAPE(2, 3)); }
static void mk_ids(nb_tensor **in) { in[0] = i64(NB_SHAPE(2)); }
static void mk_mha(nb_tensor **in) {
    for (int i = 0; i < 3; i++) in[i] = fdef(NB_SHAPE(1, 3, 4));
    in[3] = made(nb_tril_mask(3, 3));
}
static void mk_x4(nb_tensor **in) { in[0] = fdef(NB_SHAPE(1, 3, 4)); }
/* the recurrent cells' x (2,3), h (2,4) and c (2,4) */
static void mk_cell(nb_tensor **in) {
    in[0] = fdef(NB_SHAPE(2, 3)), in[1] = fdef(NB_SHAPE(2, 4)), in[2] = fdef(NB_SHAPE(2, 4));
}
static void mk_ncl(nb_tensor **in) { in[0] = fdef(NB_SHAPE(1, 2, 5)); }
static void mk_nchw(nb_tensor **in) { in[0] = fdef(NB_SHAPE(1, 2, 4, 4)); }
static bool lstmcell_failed(nb_tensor **in) {
    nb_tensor *h, *c;
    return nb_lstmcell_forward(&mods.lstm, in[0], in[1], in[2], &h, &c) == -1;
}
static void mk_gpt_ids(nb_tensor **in) { in[0] = i64(NB_SHAPE(1, 3)); }
static void mk_gpt_loss(nb_tensor **in) { in[0] = i64(NB_SHAPE(1, 3)), in[1] = i64(NB_SHAPE(1, 3)); }
static void mk_xavier(nb_tensor **in) { in[0] = fdef(NB_SHAPE(3, 4)); }
static void mk_encode(nb_tensor **in) {
    in[0] = i64(NB_SHAPE(1, 3)), in[1] = keep_all(NB_SHAPE(1, 1, 1, 3));
}
static void mk_decode(nb_tensor **in) {
    in[0] = fdef(NB_SHAPE(1, 3, 4)), in[1] = keep_all(NB_SHAPE(1, 1, 1, 3));
    in[2] = i64(NB_SHAPE(1, 2)), in[3] = made(nb_tril_mask(2, 2));
}
static void mk_logits(nb_tensor **in) { in[0] = fdef(NB_SHAPE(1, 2, 4)); }

/* ------------------------------------------------ calls that need a helper */
/* nb_print's failure is printing "tensor(freed)" (stdout is captured). */
static bool print_failed(const nb_tensor *t) {
    char buf[512];
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), STDOUT_FILENO), 0);
    nb_print(t);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    return strcmp(buf, "tensor(freed)\n") == 0;
}

static bool copy_failed(const nb_tensor *t) {
    double out[6] = {0};
    return nb_copy_to_f64(t, out) == -1;
}

static nb_tensor *product(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_mul(in[0], in[1]);
}
static bool gradcheck_failed(nb_tensor **in) {
    return !nb_gradcheck(product, NULL, 2, in, NULL, NULL);
}
static bool gradgradcheck_failed(nb_tensor **in) {
    return !nb_gradgradcheck(product, NULL, 2, in, NULL, NULL);
}
static bool autograd_grad_failed(nb_tensor **in) { /* in[0]: the output, in[1]: the input */
    nb_tensor *g[1];
    return nb_autograd_grad(&in[0], 1, NULL, &in[1], 1, NULL, g) == -1;
}
static nb_tensor *square(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_mul(in[0], in[0]);
}
static bool checkpoint_failed(nb_tensor **in) {
    return nb_checkpoint(square, NULL, 1, &in[0]) == NULL;
}
static bool jvp_failed(nb_tensor **in) { /* in[0]: the input, in[1]: its tangent */
    nb_tensor *y, *ty;
    return nb_jvp(square, NULL, 1, &in[0], &in[1], &y, &ty) == -1;
}

/* a registry of its own, so that the name is new every time */
static bool params_add_failed(nb_tensor *t, bool buffer) {
    nb_params *ps = nb_params_new();
    nb_tensor *r = buffer ? nb_params_add_buffer(ps, "b", t) : nb_params_add(ps, "w", t);
    nb_params_free(ps);
    return r == NULL;
}

/* nb_keep's result goes to the enclosing scope (persistent at depth 1),
 * nb_persistent's is persistent: freed here */
static bool keep_failed(nb_tensor *t) {
    nb_tensor *k = nb_keep(t);
    nb_free(k);
    return k == NULL;
}
static bool persistent_failed(nb_tensor *t) {
    nb_tensor *p = nb_persistent(t);
    nb_free(p);
    return p == NULL;
}
static bool persistent_held_failed(nb_tensor *t) {
    nb_tensor *p = nb_persistent_held(t);
    nb_free_with_owner(p);
    return p == NULL;
}

/* weights_out must be NULL exactly when the call failed */
static bool attention_failed(nb_tensor **in) {
    nb_tensor *w = in[0];
    nb_tensor *r = nb_attention(in[0], in[1], in[2], in[3], 0.0, false, NULL, &w);
    ck_assert((r == NULL) == (w == NULL));
    return r == NULL;
}
static bool mha_failed(nb_tensor **in) {
    nb_tensor *w = in[0];
    nb_tensor *r = nb_mha_forward(&mods.mha, in[0], in[1], in[2], in[3], false, NULL, &w);
    ck_assert((r == NULL) == (w == NULL));
    return r == NULL;
}

/* ---------------------------------------------------------------- the table */
/* X(function, tensor inputs, maker, failed): `failed` is true when the call
 * with inputs `in` gave the function's failure value; a void function has
 * none, so there it is whether a message was set. A freed handle is made by
 * the same maker as the live input it replaces, so only its being freed
 * differs. Live inputs must not look like failures: nb_dtype_of fails with
 * NB_F32, so its input is f64; the bool functions get inputs for which they
 * are true; nb_grad a leaf that has a .grad. */
#define VOID_FAILED(call) ((call), nb_last_error() != NULL)
#define NB_RNG1 (&(nb_rng){.seed = 1})
#define HANDLE_CASES(X)                                                                          \
    /* inspection */                                                                             \
    X(nb_ndim, 1, one, nb_ndim(in[0]) == -1)                                                     \
    X(nb_shape, 1, one, nb_shape(in[0]) == NULL)                                                 \
    X(nb_strides, 1, one, nb_strides(in[0]) == NULL)                                             \
    X(nb_size, 1, one, nb_size(in[0], 0) == -1)                                                  \
    X(nb_numel, 1, one, nb_numel(in[0]) == -1)                                                   \
    X(nb_dtype_of, 1, one, nb_dtype_of(in[0]) == NB_F32)                                         \
    X(nb_is_contiguous, 1, one, !nb_is_contiguous(in[0]))                                        \
    X(nb_data, 1, one, nb_data(in[0]) == NULL)                                                   \
    X(nb_mark_modified, 1, one, VOID_FAILED(nb_mark_modified(in[0])))                            \
    X(nb_write_version, 1, one, VOID_FAILED((void)nb_write_version(in[0])))                      \
    X(nb_item, 1, scalar, isnan(nb_item(in[0])))                                                 \
    X(nb_copy_to_f64, 1, one, copy_failed(in[0]))                                                \
    X(nb_print, 1, one, print_failed(in[0]))                                                     \
    X(nb_copy_into, 2, two, nb_copy_into(in[0], in[1]) == -1)                                    \
    X(nb_shares_memory, 1, one, !nb_shares_memory(in[0], in[0]))                                 \
    /* autograd */                                                                               \
    X(nb_set_requires_grad, 1, one, nb_set_requires_grad(in[0], true) == NULL)                   \
    X(nb_requires_grad, 1, leaf, !nb_requires_grad(in[0]))                                       \
    X(nb_is_leaf, 1, one, !nb_is_leaf(in[0]))                                                    \
    X(nb_grad, 1, leaf_grad, nb_grad(in[0]) == NULL)                                             \
    X(nb_backward, 1, loss, nb_backward(in[0]) == -1)                                            \
    X(nb_backward_with_grad, 2, out_grad, nb_backward_with_grad(in[0], in[1]) == -1)             \
    X(nb_backward_with_opts, 2, out_grad,                                                        \
      nb_backward_with_opts(in[0], in[1], &(nb_backward_opts){.retain_graph = true}) == -1)      \
    X(nb_zero_grad, 1, leaf_grad, VOID_FAILED(nb_zero_grad(in[0])))                              \
    X(nb_clear_grad, 1, leaf_grad, VOID_FAILED(nb_clear_grad(in[0])))                            \
    X(nb_set_grad_hook, 1, leaf, nb_set_grad_hook(in[0], NULL, NULL) == -1)                      \
    X(nb_set_grad_contribution_hook, 1, leaf,                                                    \
      nb_set_grad_contribution_hook(in[0], NULL, NULL) == -1)                                    \
    X(nb_grad_so_far, 1, leaf, VOID_FAILED((void)nb_grad_so_far(in[0])))                         \
    X(nb_detach, 1, one, nb_detach(in[0]) == NULL)                                               \
    X(nb_gradcheck, 2, gradcheck, gradcheck_failed(in))                                          \
    X(nb_gradgradcheck, 2, gradcheck, gradgradcheck_failed(in))                                  \
    X(nb_autograd_grad, 2, loss_leaf, autograd_grad_failed(in))                                  \
    X(nb_jvp, 2, gradcheck, jvp_failed(in))                                                      \
    X(nb_checkpoint, 1, one, checkpoint_failed(in))                                              \
    /* memory and argument checks */                                                             \
    X(nb_keep, 1, one, keep_failed(in[0]))                                                       \
    X(nb_persistent, 1, one, persistent_failed(in[0]))                                           \
    X(nb_persistent_held, 1, one, persistent_held_failed(in[0]))                                 \
    X(nb_free, 1, one, VOID_FAILED(nb_free(in[0])))                                              \
    X(nb_free_with_owner, 1, one, VOID_FAILED(nb_free_with_owner(in[0])))                        \
    X(nb_check_input, 1, one, nb_check_input("nb_check_input", in[0], 0) == -1)                  \
    /* nn: registries, functional forms, modules */                                              \
    X(nb_params_add, 1, one, params_add_failed(in[0], false))                                    \
    X(nb_params_add_buffer, 1, one, params_add_failed(in[0], true))                              \
    X(nb_linear, 3, linear, nb_linear(in[0], in[1], in[2]) == NULL)                              \
    X(nb_embedding, 2, embedding, nb_embedding(in[0], in[1]) == NULL)                            \
    X(nb_layer_norm, 3, layer_norm, nb_layer_norm(in[0], in[1], in[2], 1e-5) == NULL)            \
    X(nb_cross_entropy, 2, cross_entropy, nb_cross_entropy(in[0], in[1], -1, 0.1) == NULL)       \
    X(nb_attention, 4, attention, attention_failed(in))                                          \
    X(nb_linear_forward, 1, x3, nb_linear_forward(&mods.lin, in[0]) == NULL)                     \
    X(nb_embedding_forward, 1, ids, nb_embedding_forward(&mods.emb, in[0]) == NULL)              \
    X(nb_layernorm_forward, 1, x3, nb_layernorm_forward(&mods.ln, in[0]) == NULL)                \
    X(nb_batchnorm_forward, 1, x3, nb_batchnorm_forward(&mods.bn, in[0]) == NULL)                \
    X(nb_rnncell_forward, 2, cell, nb_rnncell_forward(&mods.rnn, in[0], in[1]) == NULL)          \
    X(nb_grucell_forward, 2, cell, nb_grucell_forward(&mods.gru, in[0], in[1]) == NULL)          \
    X(nb_lstmcell_forward, 3, cell, lstmcell_failed(in))                                         \
    X(nb_conv1d_forward, 1, ncl, nb_conv1d_forward(&mods.c1, in[0]) == NULL)                     \
    X(nb_conv2d_forward, 1, nchw, nb_conv2d_forward(&mods.c2, in[0]) == NULL)                    \
    X(nb_mha_forward, 4, mha, mha_failed(in))                                                    \
    X(nb_feedforward_forward, 1, x4,                                                             \
      nb_feedforward_forward(&mods.ff, in[0], false, NULL) == NULL)                              \
    X(nb_init_xavier_uniform, 1, xavier, nb_init_xavier_uniform(in[0], NB_RNG1) == -1)           \
    X(nb_transformer_encode, 2, encode,                                                          \
      nb_transformer_encode(&mods.tr, in[0], in[1], false, NULL) == NULL)                        \
    X(nb_transformer_decode, 4, decode,                                                          \
      nb_transformer_decode(&mods.tr, in[0], in[1], in[2], in[3], false, NULL) == NULL)          \
    X(nb_transformer_logits, 1, logits, nb_transformer_logits(&mods.tr, in[0]) == NULL)       \
    X(nb_activate, 1, x4, nb_activate(in[0], NB_ACT_GELU_TANH) == NULL)                         \
    X(nb_gpt_forward, 1, gpt_ids, nb_gpt_forward(&mods.gpt, in[0], false, NULL) == NULL)       \
    X(nb_gpt_loss, 2, gpt_loss, nb_gpt_loss(&mods.gpt, in[0], in[1], false, NULL) == NULL)

typedef struct handle_case {
    const char *name;
    int n;                         /* tensor inputs: positions 0..n-1 */
    void (*make)(nb_tensor **in);  /* valid inputs, in the current scope */
    bool (*call)(nb_tensor **in);  /* true when the call failed */
} handle_case;

#define DEFINE_CALL(fn, n, mk, failed) \
    static bool call_##fn(nb_tensor **in) { return (failed); }
HANDLE_CASES(DEFINE_CALL)
#define CASE_ENTRY(fn, n, mk, failed) {#fn, n, mk_##mk, call_##fn},
static const handle_case cases[] = {HANDLE_CASES(CASE_ENTRY)};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* Functions of nabla.h that take a tensor but are not in the table. */
static const struct {
    const char *name, *reason;
} exempt[] = {
    {"nb_function_apply", "tests/test_function.c"},
    {"nb_function_apply_multi", "tests/test_function.c"},
    {"nb_function_save", "tests/test_function.c"},
    {"nb_function_saved", "tests/test_function.c"},
    {"nb_function_needs_input_grad", "tests/test_function.c"},
    {"nb_function_mark_non_differentiable", "tests/test_function.c"},
};
#define NEXEMPT (int)(sizeof exempt / sizeof exempt[0])

/* The ops of ops/registry.h: test_registry.c frees each input of each op. */
#define REGISTRY_NAME(name, inputs, flags, call) "nb_" #name,
static const char *const registry_ops[] = {NB_OPS(REGISTRY_NAME)};
#define NREGISTRY (int)(sizeof registry_ops / sizeof registry_ops[0])

/* ----------------------------------------------------------- the runner */
enum { BY_FREE, BY_SCOPE };
static const char *const how_text[] = {BY_FREE_TEXT, BY_SCOPE_TEXT};
static const char *const how_name[] = {"by nb_free", "by its scope's end"};

/* A freed handle for position i of c, made by c's maker and then freed. */
static nb_tensor *dead_input(const handle_case *c, int i, int how) {
    nb_tensor *in[MAX_IN] = {0};
    if (how == BY_SCOPE) nb_scope_begin();
    c->make(in);
    nb_tensor *dead = in[i];
    if (how == BY_SCOPE) nb_scope_end();
    else nb_free(dead);
    ck_assert_msg(nb_last_error() == NULL, "%s: freeing input %d: %s", c->name, i, msg_or_none());
    return dead;
}

/* How fn's messages name tensor argument i of the table's call: "input i",
 * except for the functions that take arrays of several kinds. */
static const char *arg_name(const char *fn, int i) {
    static char buf[32];
    if (!strcmp(fn, "nb_autograd_grad")) return i == 0 ? "output 0" : "input 0";
    if (!strcmp(fn, "nb_jvp")) return i == 0 ? "input 0" : "tangent 0";
    snprintf(buf, sizeof buf, "input %d", i);
    return buf;
}

static void check_case(const handle_case *c) {
    ck_assert(c->n >= 1 && c->n <= MAX_IN);
    nb_tensor *in[MAX_IN] = {0};
    /* with every input live the call succeeds, so the failures below are the
     * freed handle's doing */
    nb_scope_begin();
    c->make(in);
    nb_clear_error();
    ck_assert_msg(!c->call(in), "%s: fails with live inputs: %s", c->name, msg_or_none());
    ck_assert_msg(nb_last_error() == NULL, "%s: live inputs, but the message \"%s\"", c->name,
                  nb_last_error());
    nb_scope_end();

    for (int how = BY_FREE; how <= BY_SCOPE; how++)
        for (int i = 0; i < c->n; i++) {
            nb_scope_begin();
            nb_tensor *dead = dead_input(c, i, how);
            c->make(in);
            in[i] = dead;
            bool failed = c->call(in);
            char want[300];
            snprintf(want, sizeof want, "%s: %s was freed (%s", c->name, arg_name(c->name, i),
                     how_text[how]);
            const char *msg = nb_last_error();
            ck_assert_msg(failed, "%s: input %d freed %s: the call did not fail (message: %s)",
                          c->name, i, how_name[how], msg_or_none());
            ck_assert_msg(msg && strstr(msg, want), "%s: input %d freed %s: message \"%s\", "
                          "expected \"%s\"", c->name, i, how_name[how], msg_or_none(), want);
            nb_clear_error();
            nb_scope_end();
        }
    /* and a pointer to memory that never was a tensor */
    static double other[32];
    for (int i = 0; i < c->n; i++) {
        nb_scope_begin();
        c->make(in);
        in[i] = (nb_tensor *)(void *)other;
        bool failed = c->call(in);
        char want[300];
        snprintf(want, sizeof want, "%s: %s is not a tensor", c->name, arg_name(c->name, i));
        const char *msg = nb_last_error();
        ck_assert_msg(failed, "%s: input %d not a tensor: the call did not fail (message: %s)",
                      c->name, i, msg_or_none());
        ck_assert_msg(msg && strstr(msg, want), "%s: input %d not a tensor: message \"%s\", "
                      "expected \"%s\"", c->name, i, msg_or_none(), want);
        nb_clear_error();
        nb_scope_end();
    }
}

/* One function per iteration, so that each failing one is reported. */
START_TEST(every_public_function_rejects_a_freed_handle) {
    const handle_case *c = &cases[_i];
    usage u0 = usage_now();
    mods_init();
    check_case(c);
    mods_free();
    ck_assert_int_eq(nb_scope_depth(), 0);
    expect_same_usage(u0, c->name);
}
END_TEST

/* ------------------------------------------------ the table against nabla.h */
#define MAX_API 512

typedef struct {
    int n;
    char name[MAX_API][64];
    bool takes_tensor[MAX_API];
} api_list;

/* Blanks out comments (newlines stay), so that only code is read. */
static void strip_comments(char *s) {
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *stop = e ? e + 2 : p + strlen(p);
            for (; p < stop; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            for (; *p && *p != '\n'; p++) *p = ' ';
            if (!*p) break;
        }
    }
}

static bool is_ident(char ch) {
    return ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9');
}

/* Every declaration that starts a line with NB_API: the function's name (the
 * identifier before its first parenthesis) and whether its parameter list
 * mentions nb_tensor. */
static void read_api(const char *src, api_list *api) {
    api->n = 0;
    for (const char *p = strstr(src, "NB_API "); p; p = strstr(p + 1, "NB_API ")) {
        if (p != src && p[-1] != '\n') continue; /* the #define, or not a declaration */
        const char *end = strchr(p, ';'), *open = strchr(p, '(');
        ck_assert_msg(end && open && open < end, "nabla.h: cannot read the declaration at "
                      "\"%.60s\"", p);
        const char *e = open;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n')) e--;
        const char *b = e;
        while (b > p && is_ident(b[-1])) b--;
        ck_assert_msg(e > b && e - b < 64, "nabla.h: no function name at \"%.60s\"", p);
        int depth = 0;
        const char *close = open;
        for (; close < end; close++) {
            depth += *close == '(';
            depth -= *close == ')';
            if (depth == 0) break;
        }
        ck_assert_msg(close < end, "nabla.h: unbalanced parentheses at \"%.60s\"", p);
        ck_assert(api->n < MAX_API);
        memcpy(api->name[api->n], b, (size_t)(e - b));
        api->name[api->n][e - b] = 0;
        bool tensor = false;
        for (const char *q = open; q + 9 <= close && !tensor; q++)
            tensor = strncmp(q, "nb_tensor", 9) == 0;
        api->takes_tensor[api->n++] = tensor;
    }
}

static int api_find(const api_list *api, const char *name) {
    for (int i = 0; i < api->n; i++)
        if (!strcmp(api->name[i], name)) return i;
    return -1;
}

START_TEST(the_table_covers_nabla_h) {
    usage u0 = usage_now();
    char *src = test_read_file(NB_FIXTURE_DIR "/../../nabla.h", NULL);
    strip_comments(src);
    static api_list api;
    read_api(src, &api);
    free(src);

    /* the reading works: known functions are seen as they are */
    int ntensor = 0;
    for (int i = 0; i < api.n; i++) ntensor += api.takes_tensor[i];
    ck_assert_msg(ntensor >= 80, "only %d NB_API functions taking a tensor found", ntensor);
    ck_assert(api_find(&api, "nb_add") >= 0 && api.takes_tensor[api_find(&api, "nb_add")]);
    ck_assert(api_find(&api, "nb_cat") >= 0 && api.takes_tensor[api_find(&api, "nb_cat")]);
    ck_assert(api_find(&api, "nb_zeros") >= 0 && !api.takes_tensor[api_find(&api, "nb_zeros")]);
    ck_assert(api_find(&api, "nb_report_error") >= 0);

    /* every function that takes a tensor is in the table or exempt */
    char missing[2048] = "";
    int nmissing = 0;
    for (int i = 0; i < api.n; i++) {
        if (!api.takes_tensor[i]) continue;
        bool found = false;
        for (int k = 0; k < NCASES && !found; k++) found = !strcmp(cases[k].name, api.name[i]);
        for (int k = 0; k < NEXEMPT && !found; k++) found = !strcmp(exempt[k].name, api.name[i]);
        for (int k = 0; k < NREGISTRY && !found; k++) found = !strcmp(registry_ops[k], api.name[i]);
        if (!found) {
            nmissing++;
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, " %s", api.name[i]);
        }
    }
    ck_assert_msg(nmissing == 0, "%d function(s) of nabla.h that take a tensor are neither in the "
                  "table of test_handles.c, the registry nor exempt:%s", nmissing, missing);

    /* and the lists hold no stale or doubled name */
    for (int k = 0; k < NCASES; k++) {
        int i = api_find(&api, cases[k].name);
        ck_assert_msg(i >= 0, "table: %s is not declared in nabla.h", cases[k].name);
        ck_assert_msg(api.takes_tensor[i], "table: %s takes no tensor", cases[k].name);
        for (int j = 0; j < k; j++)
            ck_assert_msg(strcmp(cases[j].name, cases[k].name), "table: %s twice", cases[k].name);
        for (int j = 0; j < NEXEMPT; j++)
            ck_assert_msg(strcmp(exempt[j].name, cases[k].name), "%s: in the table and exempt",
                          cases[k].name);
    }
    for (int k = 0; k < NEXEMPT; k++) {
        ck_assert_msg(api_find(&api, exempt[k].name) >= 0, "exempt: %s is not declared in "
                      "nabla.h", exempt[k].name);
        ck_assert_msg(exempt[k].reason && exempt[k].reason[0], "exempt: %s has no reason",
                      exempt[k].name);
    }
    printf("handles: %d functions of nabla.h take a tensor: %d in the table, %d exempt\n",
           ntensor, NCASES, ntensor - NCASES);
    fflush(stdout);
    expect_same_usage(u0, "header");
}
END_TEST

/* --------------------------------------------------- borrowed tensors */
START_TEST(a_borrowed_grad_dies_with_its_leaf) {
    usage u0 = usage_now();
    /* a persistent leaf, freed by nb_free */
    nb_tensor *x = made(nb_set_requires_grad(nb_scalar(NB_F64, 3.0), true));
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_mul(x, x)), 0);
    nb_scope_end();
    nb_tensor *g = nb_grad(x);
    ck_assert_ptr_nonnull(g);
    ck_assert_double_eq(nb_item(g), 6.0);
    nb_free(x);
    ck_assert_ptr_null(nb_last_error());
    ck_assert(isnan(nb_item(g)));
    expect_freed("nb_item", 0, WITH_OWNER_TEXT);
    ck_assert_ptr_null(nb_mul_scalar(g, 2.0));
    expect_freed("nb_mul_scalar", 0, WITH_OWNER_TEXT);
    nb_free(g);
    expect_freed("nb_free", 0, WITH_OWNER_TEXT);

    /* a leaf of a scope: its .grad goes when the scope ends */
    nb_scope_begin();
    nb_tensor *y = made(nb_set_requires_grad(nb_scalar(NB_F64, -2.0), true));
    ck_assert_int_eq(nb_backward(nb_mul(y, y)), 0);
    g = nb_grad(y);
    ck_assert_double_eq(nb_item(g), -4.0);
    nb_scope_end();
    ck_assert(isnan(nb_item(g)));
    expect_freed("nb_item", 0, WITH_OWNER_TEXT);
    ck_assert(isnan(nb_item(y)));
    expect_freed("nb_item", 0, BY_SCOPE_TEXT);
    expect_same_usage(u0, "grad");
}
END_TEST

START_TEST(a_registry_tensor_dies_with_its_registry) {
    usage u0 = usage_now();
    nb_params *ps = nb_params_new();
    nb_tensor *t = nb_scalar(NB_F64, 2.5);
    nb_tensor *p = nb_params_add(ps, "w", t);
    nb_tensor *bt = nb_scalar(NB_I64, 7);
    nb_tensor *b = nb_params_add_buffer(ps, "steps", bt);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(b);
    nb_free(t); /* the caller's handles; the registry keeps its own */
    nb_free(bt);
    ck_assert_double_eq(nb_item(p), 2.5);
    ck_assert_double_eq(nb_item(b), 7.0);
    ck_assert(isnan(nb_item(t)));
    expect_freed("nb_item", 0, BY_FREE_TEXT);

    nb_params_free(ps);
    ck_assert(isnan(nb_item(p)));
    expect_freed("nb_item", 0, WITH_OWNER_TEXT);
    ck_assert_int_eq(nb_copy_to_f64(b, (double[1]){0}), -1);
    expect_freed("nb_copy_to_f64", 0, WITH_OWNER_TEXT);
    ck_assert(!nb_requires_grad(p));
    expect_freed("nb_requires_grad", 0, WITH_OWNER_TEXT);

    /* an optimizer's state is a registry the optimizer owns */
    ps = nb_params_new();
    t = nb_scalar(NB_F64, 2.5);
    p = nb_params_add(ps, "w", t);
    nb_free(t);
    nb_optim *opt = nb_sgd(ps, 0.1, 0.9, 0.0);
    ck_assert_ptr_nonnull(opt);
    nb_tensor *step = nb_params_get(nb_optim_state(opt), "w.step");
    nb_tensor *mom = nb_params_get(nb_optim_state(opt), "w.momentum_buffer");
    ck_assert_msg(step && mom, "%s", msg_or_none());
    ck_assert_double_eq(nb_item(step), 0.0);
    nb_optim_free(opt);
    ck_assert(isnan(nb_item(step)));
    expect_freed("nb_item", 0, WITH_OWNER_TEXT);
    ck_assert_ptr_null(nb_add(p, mom));
    expect_freed("nb_add", 1, WITH_OWNER_TEXT);
    nb_params_free(ps);

    /* a module's parameters belong to the registry too */
    ps = nb_params_new();
    nb_Linear lin;
    ck_assert_int_eq(nb_linear_init(&lin, ps, "lin", 3, 2, true, NB_RNG1), 0);
    nb_params_free(ps);
    nb_scope_begin();
    ck_assert_ptr_null(nb_linear_forward(&lin, fdef(NB_SHAPE(1, 3))));
    ck_assert_msg(nb_last_error() && strstr(nb_last_error(), "was freed (" WITH_OWNER_TEXT),
                  "message: %s", msg_or_none());
    nb_clear_error();
    nb_scope_end();
    expect_same_usage(u0, "registry");
}
END_TEST

/* --------------------------------------------------------- the window */
#define STALE 1000

START_TEST(the_window_holds) {
    usage u0 = usage_now();
    /* stale handles of both kinds, scalars whose nb_item would be 7 or 8 */
    nb_tensor *stale[STALE];
    for (int k = 0; k < STALE; k += 2) {
        stale[k] = made(nb_scalar(NB_F64, 7.0));
        nb_free(stale[k]);
        nb_scope_begin();
        stale[k + 1] = made(nb_scalar(NB_F64, 8.0));
        nb_scope_end();
    }
    /* then 10,000 other tensors come and go: scoped ones and persistent ones
     * freed by nb_free, interleaved (the window is 16,384 allocations) */
    int made_n = 0;
    for (int round = 0; round < 50; round++) {
        nb_scope_begin();
        for (int k = 0; k < 100; k++, made_n++) made(nb_scalar(NB_F64, k));
        nb_scope_end();
        for (int k = 0; k < 100; k++, made_n++) nb_free(made(nb_full(NB_F64, NB_SHAPE(2), k)));
    }
    ck_assert_int_eq(made_n, 10000);
    ck_assert_int_lt(made_n + STALE, NB_HANDLE_WINDOW);
    for (int k = 0; k < STALE; k++) {
        ck_assert_msg(isnan(nb_item(stale[k])), "stale handle %d gave a value", k);
        expect_freed("nb_item", 0, k % 2 ? BY_SCOPE_TEXT : BY_FREE_TEXT);
    }

    /* live tensors made now: no stale handle is one of them or shows their values */
    enum { NLIVE = 64 };
    nb_tensor *live[NLIVE];
    for (int j = 0; j < NLIVE; j++) live[j] = made(nb_scalar(NB_F64, 1000.0 + j));
    for (int k = 0; k < STALE; k++) {
        for (int j = 0; j < NLIVE; j++)
            ck_assert_msg((uintptr_t)stale[k] != (uintptr_t)live[j],
                          "stale handle %d is live tensor %d", k, j);
        double out = -1.0;
        ck_assert_int_eq(nb_copy_to_f64(stale[k], &out), -1);
        ck_assert_double_eq(out, -1.0); /* nothing written */
        expect_freed("nb_copy_to_f64", 0, k % 2 ? BY_SCOPE_TEXT : BY_FREE_TEXT);
        ck_assert_ptr_null(nb_data(stale[k]));
        expect_freed("nb_data", 0, k % 2 ? BY_SCOPE_TEXT : BY_FREE_TEXT);
        ck_assert_ptr_null(nb_add(live[k % NLIVE], stale[k]));
        expect_freed("nb_add", 1, k % 2 ? BY_SCOPE_TEXT : BY_FREE_TEXT);
    }
    for (int j = 0; j < NLIVE; j++) {
        ck_assert_double_eq(nb_item(live[j]), 1000.0 + j);
        nb_free(live[j]);
    }
    ck_assert_ptr_null(nb_last_error());
    expect_same_usage(u0, "window");
}
END_TEST

/* ------------------------------------------------- a graph holds on */
START_TEST(freed_inside_a_graph) {
    usage u0 = usage_now();
    const double xv[] = {0.5, -1.0, 2.0}, yv[] = {1.5, 2.0, -0.5}, zv[] = {0.25, -0.5, 1.0};
    nb_tensor *x = made(nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), xv), true));
    nb_tensor *y = made(nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), yv), true));
    nb_tensor *z = made(nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), zv), true));
    /* loss = sum(exp(x y) y) + sum(z x): the graph saves h's inputs, e, y, z */
    nb_tensor *h = made(nb_mul(x, y));
    nb_tensor *e = made(nb_exp(h));
    nb_tensor *ey = made(nb_mul(e, y));
    nb_tensor *zx = made(nb_mul(z, x));
    nb_tensor *s1 = made(nb_sum_all(ey)), *s2 = made(nb_sum_all(zx));
    nb_tensor *loss = made(nb_add(s1, s2));
    double want_loss = 0;
    for (int i = 0; i < 3; i++) want_loss += exp(xv[i] * yv[i]) * yv[i] + zv[i] * xv[i];
    ck_assert_double_eq_tol(nb_item(loss), want_loss, 1e-12);

    /* the user lets go of intermediates and of a leaf the graph reads */
    nb_free(h);
    nb_free(e);
    nb_free(ey);
    nb_free(z);
    ck_assert_ptr_null(nb_last_error());
    ck_assert_ptr_null(nb_exp(e));
    expect_freed("nb_exp", 0, BY_FREE_TEXT);
    ck_assert_ptr_null(nb_mul(x, z));
    expect_freed("nb_mul", 1, BY_FREE_TEXT);

    ck_assert_int_eq(nb_backward(loss), 0);
    double gx[3], gy[3];
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), gx), 0);
    ck_assert_int_eq(nb_copy_to_f64(nb_grad(y), gy), 0);
    for (int i = 0; i < 3; i++) {
        double ev = exp(xv[i] * yv[i]);
        ck_assert_double_eq_tol(gx[i], ev * yv[i] * yv[i] + zv[i], 1e-12);
        ck_assert_double_eq_tol(gy[i], ev * (xv[i] * yv[i] + 1.0), 1e-12);
    }

    /* afterwards the freed handles are still rejected, the live ones work */
    ck_assert_ptr_null(nb_grad(z));
    expect_freed("nb_grad", 0, BY_FREE_TEXT);
    ck_assert_int_eq(nb_copy_to_f64(h, gx), -1);
    expect_freed("nb_copy_to_f64", 0, BY_FREE_TEXT);
    ck_assert_int_eq(nb_backward(ey), -1);
    expect_freed("nb_backward", 0, BY_FREE_TEXT);
    nb_free(e);
    expect_freed("nb_free", 0, BY_FREE_TEXT);
    ck_assert_int_eq(nb_numel(zx), 3);
    nb_free(zx);
    nb_free(s1);
    nb_free(s2);
    nb_free(loss);
    nb_free(x);
    nb_free(y);
    ck_assert_ptr_null(nb_last_error());
    expect_same_usage(u0, "graph");
}
END_TEST

/* nb_check_input names the caller's function and position. */
START_TEST(check_input_names_the_caller) {
    usage u0 = usage_now();
    nb_tensor *t = made(nb_ones(NB_F32, NB_SHAPE(2)));
    ck_assert_int_eq(nb_check_input("my_op", t, 2), 0);
    ck_assert_ptr_null(nb_last_error());
    nb_free(t);
    ck_assert_int_eq(nb_check_input("my_op", t, 2), -1);
    expect_freed("my_op", 2, BY_FREE_TEXT);
    expect_same_usage(u0, "check_input");
}
END_TEST

/* -------------------------------------------------------------- threads */
typedef struct {
    nb_tensor *by_free, *by_scope; /* freed on the thread that made them */
} dead_pair;

static void *free_on_thread(void *arg) {
    dead_pair *d = arg;
    d->by_free = nb_scalar(NB_F64, 7.0);
    nb_free(d->by_free);
    nb_scope_begin();
    d->by_scope = nb_scalar(NB_F64, 8.0);
    nb_scope_end();
    return NULL;
}

typedef struct {
    const dead_pair *d;
    double got[2];
    char msg[2][512];
} use_report;

/* Allocates first (which may reuse aged objects of the exited thread), then
 * uses the stale handles. */
static void *use_on_thread(void *arg) {
    use_report *r = arg;
    for (int round = 0; round < 20; round++) {
        nb_scope_begin();
        for (int k = 0; k < 100; k++) nb_scalar(NB_F64, k);
        nb_scope_end();
    }
    nb_tensor *t[2] = {r->d->by_free, r->d->by_scope};
    for (int k = 0; k < 2; k++) {
        nb_clear_error();
        r->got[k] = nb_item(t[k]);
        snprintf(r->msg[k], sizeof r->msg[k], "%s", msg_or_none());
    }
    nb_clear_error();
    return NULL;
}

START_TEST(a_thread_s_freed_handles_outlive_it) {
    usage u0 = usage_now();
    dead_pair d = {NULL, NULL};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, free_on_thread, &d), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert(d.by_free && d.by_scope);

    /* on another thread, made after the first one exited */
    use_report r = {&d, {0, 0}, {"", ""}};
    ck_assert_int_eq(pthread_create(&th, NULL, use_on_thread, &r), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    const char *want[2] = {"nb_item: input 0 was freed (" BY_FREE_TEXT,
                           "nb_item: input 0 was freed (" BY_SCOPE_TEXT};
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(isnan(r.got[k]), "handle %d gave %g", k, r.got[k]);
        ck_assert_msg(strstr(r.msg[k], want[k]), "handle %d: \"%s\"", k, r.msg[k]);
    }
    /* and on this one */
    ck_assert(isnan(nb_item(d.by_free)));
    expect_freed("nb_item", 0, BY_FREE_TEXT);
    ck_assert_ptr_null(nb_neg(d.by_scope));
    expect_freed("nb_neg", 0, BY_SCOPE_TEXT);
    nb_free(d.by_free);
    expect_freed("nb_free", 0, BY_FREE_TEXT);
    expect_same_usage(u0, "threads");
}
END_TEST

/* After each test, even a failed one (CK_FORK=no runs every test in one
 * process): close the scopes it left open, free the modules, drop the message. */
static void teardown(void) {
    while (nb_scope_depth() > 0) nb_scope_end();
    mods_free();
    nb_clear_error();
}

Suite *suite_handles(void) {
    Suite *s = suite_create("handles");
    TCase *tc = tcase_create("table");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_loop_test(tc, every_public_function_rejects_a_freed_handle, 0, NCASES);
    tcase_add_test(tc, the_table_covers_nabla_h);
    suite_add_tcase(s, tc);

    tc = tcase_create("lifetimes");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, a_borrowed_grad_dies_with_its_leaf);
    tcase_add_test(tc, a_registry_tensor_dies_with_its_registry);
    tcase_add_test(tc, the_window_holds);
    tcase_add_test(tc, freed_inside_a_graph);
    tcase_add_test(tc, check_input_names_the_caller);
    tcase_add_test(tc, a_thread_s_freed_handles_outlive_it);
    suite_add_tcase(s, tc);
    return s;
}
