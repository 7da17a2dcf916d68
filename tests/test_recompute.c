/* test_recompute.c: nb_checkpoint (activation checkpointing): the same
 * gradients as a plain backward, bit for bit (GPT blocks with dropout, on
 * 1 and 2 threads, in f32 and under bf16 autocast), less memory kept after
 * the forward, gradcheck through it, hooks and nb_autograd_grad, and every
 * refusal by its message. */
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>

/* ------------------------------------------------ GPT blocks, bit for bit */
typedef struct {
    float *loss;
    float **grads; /* one per parameter, in the registry's order */
    int n;
} run_result;

static void free_result(run_result *r) {
    for (int i = 0; i < r->n; i++) free(r->grads[i]);
    free(r->grads);
    free(r->loss);
}

/* A small GPT with dropout: the loss of two steps' batches and every
 * parameter's gradient (summed over both), with or without checkpointing. */
static run_result gpt_run(bool checkpoint, int threads, bool bf16, uint64_t drop_seed) {
    nb_set_num_threads(threads);
    nb_GPTConfig cfg = {.vocab_size = 37, .block_size = 16, .n_layer = 3, .n_head = 2,
                        .n_embd = 32, .dropout = 0.2, .bias = true, .tie_weights = true};
    nb_params *ps = nb_params_new();
    nb_GPT m;
    nb_rng init, drop;
    nb_rng_seed(&init, 5);
    nb_rng_seed(&drop, drop_seed);
    ck_assert_int_eq(nb_gpt_init(&m, ps, &cfg, &init), 0);
    m.checkpoint = checkpoint;
    int64_t B = 3, T = 16, idx[48], tgt[48];
    run_result r = {.loss = malloc(2 * sizeof(float))};
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < 48; i++) idx[i] = (i * 7 + step * 3) % 37, tgt[i] = (i * 5 + 1) % 37;
        nb_scope_begin();
        nb_tensor *x = nb_from_data(NB_I64, NB_SHAPE(B, T), idx);
        nb_tensor *y = nb_from_data(NB_I64, NB_SHAPE(B, T), tgt);
        if (bf16) nb_autocast_begin(NB_BF16);
        nb_tensor *loss = nb_gpt_loss(&m, x, y, true, &drop);
        if (bf16) nb_autocast_end();
        ck_assert_msg(loss, "%s", nb_last_error());
        ck_assert_int_eq(nb_backward(loss), 0);
        r.loss[step] = (float)nb_item(loss);
        nb_scope_end();
    }
    r.n = nb_params_count(ps);
    r.grads = calloc((size_t)r.n, sizeof *r.grads);
    for (int i = 0; i < r.n; i++) {
        nb_tensor *p = nb_params_at(ps, i, NULL);
        nb_tensor *g = nb_grad(p);
        ck_assert_msg(g, "parameter %d has no gradient", i);
        r.grads[i] = malloc((size_t)nb_numel(g) * sizeof(float));
        memcpy(r.grads[i], nb_data(g), (size_t)nb_numel(g) * sizeof(float));
    }
    nb_gpt_free(&m);
    nb_params_free(ps);
    nb_set_num_threads(0);
    return r;
}

START_TEST(test_gpt_blocks_bitwise) {
    nb_params *ps = nb_params_new(); /* the sizes of the parameters, for memcmp */
    nb_GPT m;
    nb_GPTConfig cfg = {.vocab_size = 37, .block_size = 16, .n_layer = 3, .n_head = 2,
                        .n_embd = 32, .dropout = 0.2, .bias = true, .tie_weights = true};
    ck_assert_int_eq(nb_gpt_init(&m, ps, &cfg, NULL), 0); /* the same shapes as gpt_run's */
    int n = nb_params_count(ps);
    int64_t *numel = malloc((size_t)n * sizeof *numel);
    for (int i = 0; i < n; i++) numel[i] = nb_numel(nb_params_at(ps, i, NULL));
    nb_gpt_free(&m);
    nb_params_free(ps);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        run_result plain = gpt_run(false, 1, bf16, 9);
        run_result other = gpt_run(false, 1, bf16, 10); /* another dropout stream */
        for (int threads = 1; threads <= 2; threads++) {
            run_result ck = gpt_run(true, threads, bf16, 9);
            ck_assert_msg(!memcmp(plain.loss, ck.loss, 2 * sizeof(float)),
                          "losses %.9g %.9g, checkpointed %.9g %.9g", plain.loss[0],
                          plain.loss[1], ck.loss[0], ck.loss[1]);
            for (int i = 0; i < n; i++)
                ck_assert_msg(!memcmp(plain.grads[i], ck.grads[i], (size_t)numel[i] * sizeof(float)),
                              "%s, %d thread(s): the gradient of parameter %d differs from the "
                              "plain backward's", bf16 ? "bf16" : "f32", threads, i);
            free_result(&ck);
        }
        /* not vacuous: gradients are nonzero, and dropout drew (another
         * stream gives another loss) */
        double norm = 0;
        for (int i = 0; i < n; i++)
            for (int64_t k = 0; k < numel[i]; k++) norm += fabs(plain.grads[i][k]);
        ck_assert(norm > 1e-3);
        ck_assert(plain.loss[0] != other.loss[0]);
        free_result(&plain);
        free_result(&other);
    }
    free(numel);
}
END_TEST

/* Checkpointing keeps only the blocks' inputs after the forward. */
START_TEST(test_gpt_memory_kept) {
    nb_GPTConfig cfg = {.vocab_size = 37, .block_size = 64, .n_layer = 4, .n_head = 2,
                        .n_embd = 64, .dropout = 0.0, .bias = true, .tie_weights = true};
    int64_t kept[2];
    for (int ck = 0; ck < 2; ck++) {
        nb_params *ps = nb_params_new();
        nb_GPT m;
        ck_assert_int_eq(nb_gpt_init(&m, ps, &cfg, NULL), 0);
        m.checkpoint = ck;
        int64_t idx[4 * 64];
        for (int i = 0; i < 4 * 64; i++) idx[i] = i % 37;
        nb_scope_begin();
        int64_t before = nb_memory_allocated();
        nb_tensor *x = nb_from_data(NB_I64, NB_SHAPE(4, 64), idx);
        nb_tensor *loss = nb_gpt_loss(&m, x, x, true, NULL);
        ck_assert_ptr_nonnull(loss);
        kept[ck] = nb_memory_allocated() - before;
        ck_assert_int_eq(nb_backward(loss), 0);
        nb_scope_end();
        nb_gpt_free(&m);
        nb_params_free(ps);
    }
    /* each block keeps ~20 activations of (B,T,C) or more; checkpointed, 1 */
    ck_assert_msg(kept[1] * 3 < kept[0], "kept after the forward: %lld bytes checkpointed, "
                  "%lld plain", (long long)kept[1], (long long)kept[0]);
}
END_TEST

/* ------------------------------------------------ a small function */
typedef struct {
    nb_tensor *w;  /* (3,4) f64, requires grad: reached through ctx */
    int calls;
    int mode;      /* misbehaviours, see below */
    nb_tensor *foreign;
} small_ctx;

/* nb_parallel_for's ranges of small_fn's mode 7: each draws (or, with
 * ctx NULL, only computes) */
static void range_fn(void *ctx, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++)
        nb_free(ctx ? nb_rand(NB_F64, NB_SHAPE(2), NULL) : nb_zeros(NB_F64, NB_SHAPE(2)));
}

/* tanh(x w) (2,4) summed with w's column sums */
static nb_tensor *small_fn(nb_tensor **in, int n, void *vctx) {
    small_ctx *c = vctx;
    (void)n;
    c->calls++;
    switch (c->mode) {
    case 1: nb_free(in[0]); break;                                   /* frees its input */
    case 2: nb_copy_into(in[0], nb_mul_scalar(in[0], 2)); break;      /* writes its input */
    case 3: return NULL;                                             /* fails */
    case 4: if (c->calls == 1) nb_free(nb_rand(NB_F64, NB_SHAPE(3), NULL)); break; /* draws once */
    case 5: if (c->calls > 1) return nb_zeros(NB_F64, NB_SHAPE(3)); break; /* changes shape */
    case 6: return nb_mul(in[0], c->foreign);                         /* history via ctx */
    case 7: nb_parallel_for(8, 1, range_fn, c); break;                /* draws in ranges */
    case 8: nb_parallel_for(8, 1, range_fn, NULL); break;             /* ranges, no draws */
    default: break;
    }
    nb_tensor *h = nb_tanh(nb_matmul(in[0], c->w));
    return nb_add(h, nb_sum(c->w, 0, false));
}

static nb_tensor *through_checkpoint(nb_tensor **in, int n, void *ctx) {
    return nb_checkpoint(small_fn, ctx, n, in);
}

static nb_tensor *randn64(int ndim, const int64_t *shape, uint64_t seed, bool grad) {
    nb_rng r;
    nb_rng_seed(&r, seed);
    nb_tensor *t = nb_randn(NB_F64, ndim, shape, &r);
    return grad ? nb_set_requires_grad(t, true) : t;
}

START_TEST(test_gradcheck_through) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, false)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true);
    expect_gradcheck("nb_checkpoint(tanh(x w) + colsum w)", through_checkpoint, &c, 1, &x);
    nb_tensor *xt = nb_transpose(randn64(NB_SHAPE(3, 2), 3, false), 0, 1);
    nb_tensor *xl = nb_set_requires_grad(nb_contiguous(xt), true);
    expect_gradcheck("nb_checkpoint, a transposed input's values", through_checkpoint, &c, 1, &xl);
    nb_scope_end();
}
END_TEST

static int hook_calls;
static double hook_sum;
static int count_hook(nb_tensor *leaf, void *ctx) {
    (void)ctx;
    hook_calls++;
    hook_sum = nb_item(nb_sum_all(nb_grad(leaf)));
    return 0;
}

/* w reached through ctx: .grad, hooks and nb_autograd_grad as without it */
START_TEST(test_ctx_leaves) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, true)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true);
    nb_tensor *gw[2], *gx[2];
    double hooked[2];
    for (int ck = 0; ck < 2; ck++) {
        nb_zero_grad(c.w);
        nb_zero_grad(x);
        hook_calls = 0;
        ck_assert_int_eq(nb_set_grad_hook(c.w, count_hook, NULL), 0);
        nb_tensor *y = ck ? nb_checkpoint(small_fn, &c, 1, &x) : small_fn(&x, 1, &c);
        ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
        ck_assert_int_eq(hook_calls, 1);
        hooked[ck] = hook_sum;
        gw[ck] = nb_mul_scalar(nb_grad(c.w), 1);
        gx[ck] = nb_mul_scalar(nb_grad(x), 1);
        nb_set_grad_hook(c.w, NULL, NULL);
    }
    expect_close(gw[1], gw[0], 0, 0);
    expect_close(gx[1], gx[0], 0, 0);
    ck_assert(hooked[0] == hooked[1]);
    /* nb_autograd_grad for w and x, .grad untouched */
    nb_tensor *y = nb_checkpoint(small_fn, &c, 1, &x);
    nb_tensor *wrt[2] = {c.w, x}, *g[2];
    nb_tensor *s = nb_sum_all(y);
    ck_assert_int_eq(nb_autograd_grad(&s, 1, NULL, wrt, 2, NULL, g), 0);
    expect_close(g[0], gw[0], 0, 0);
    expect_close(g[1], gx[0], 0, 0);
    expect_close(nb_grad(c.w), gw[0], 0, 0);
    /* retain_graph: a second backward runs the function a third time */
    nb_zero_grad(c.w);
    c.calls = 0;
    y = nb_checkpoint(small_fn, &c, 1, &x);
    s = nb_sum_all(y);
    nb_backward_opts keep = {.retain_graph = true};
    ck_assert_int_eq(nb_backward_with_opts(s, NULL, &keep), 0);
    ck_assert_int_eq(nb_backward(s), 0);
    ck_assert_int_eq(c.calls, 3);
    expect_close(nb_grad(c.w), nb_mul_scalar(gw[0], 2), 0, 1e-15);
    nb_scope_end();
}
END_TEST

/* forward mode through it: fn's own tangents */
START_TEST(test_forward_mode) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, true)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true), *t = randn64(NB_SHAPE(2, 3), 3, false);
    nb_tensor *out[2], *out_t[2];
    ck_assert_int_eq(nb_jvp(small_fn, &c, 1, &x, &t, &out[0], &out_t[0]), 0);
    ck_assert_int_eq(nb_jvp(through_checkpoint, &c, 1, &x, &t, &out[1], &out_t[1]), 0);
    expect_close(out[1], out[0], 0, 0);
    expect_close(out_t[1], out_t[0], 0, 0);
    expect_forward_ad("nb_checkpoint, forward mode", through_checkpoint, &c, 1, &x);
    nb_scope_end();
}
END_TEST

/* grad mode off: fn just runs (once), no graph */
START_TEST(test_no_grad) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, true)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true);
    nb_set_grad_enabled(false);
    nb_tensor *y = nb_checkpoint(small_fn, &c, 1, &x);
    nb_set_grad_enabled(true);
    ck_assert_ptr_nonnull(y);
    ck_assert(!nb_requires_grad(y));
    ck_assert_int_eq(c.calls, 1);
    expect_close(y, small_fn(&x, 1, &c), 0, 0);
    nb_scope_end();
}
END_TEST

/* A custom function inside a checkpointed one: cube(x) = x^3, 3 x^2 g */
static nb_tensor *cube_fwd(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n, (void)user;
    if (nb_function_save(ctx, in[0]) != 0) return NULL;
    return nb_mul(in[0], nb_mul(in[0], in[0]));
}
static int cube_bwd(nb_function_ctx *ctx, nb_tensor *g, nb_tensor **gin, void *user) {
    (void)user;
    nb_tensor *x = nb_function_saved(ctx, 0);
    gin[0] = nb_mul(g, nb_mul_scalar(nb_mul(x, x), 3));
    return gin[0] ? 0 : -1;
}
static const nb_function cube = {.name = "cube", .forward = cube_fwd, .backward = cube_bwd};
static nb_tensor *cube_of_small(nb_tensor **in, int n, void *ctx) {
    nb_tensor *y = small_fn(in, n, ctx);
    return nb_function_apply(&cube, &y, 1, NULL);
}
static nb_tensor *cube_through_checkpoint(nb_tensor **in, int n, void *ctx) {
    return nb_checkpoint(cube_of_small, ctx, n, in);
}

START_TEST(test_custom_function_inside) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, true)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true);
    nb_tensor *g[2][2];
    for (int ck = 0; ck < 2; ck++) {
        nb_tensor *y = ck ? nb_checkpoint(cube_of_small, &c, 1, &x) : cube_of_small(&x, 1, &c);
        nb_tensor *s = nb_sum_all(y), *wrt[2] = {x, c.w};
        ck_assert_int_eq(nb_autograd_grad(&s, 1, NULL, wrt, 2, NULL, g[ck]), 0);
    }
    expect_close(g[1][0], g[0][0], 0, 0);
    expect_close(g[1][1], g[0][1], 0, 0);
    expect_gradcheck("nb_checkpoint around a custom function (cube)", cube_through_checkpoint, &c,
                     1, &x);
    nb_scope_end();
}
END_TEST

START_TEST(test_refusals) {
    nb_scope_begin();
    small_ctx c = {.w = randn64(NB_SHAPE(3, 4), 1, true)};
    nb_tensor *x = randn64(NB_SHAPE(2, 3), 2, true);
    expect_error(nb_checkpoint(NULL, &c, 1, &x), "nb_checkpoint: fn is NULL");
    expect_error(nb_checkpoint(small_fn, &c, -1, &x), "nb_checkpoint: needs n >= 0");
    nb_tensor *none = NULL;
    expect_error(nb_checkpoint(small_fn, &c, 1, &none), "nb_checkpoint: input 0 is NULL");

    c.mode = 1;
    expect_error(nb_checkpoint(small_fn, &c, 1, &x), "nb_checkpoint: the function freed input 0");
    c.mode = 2;
    expect_error(nb_checkpoint(small_fn, &c, 1, &x),
                 "nb_checkpoint: the function wrote into input 0 in place");
    c.mode = 3;
    expect_error(nb_checkpoint(small_fn, &c, 1, &x), "nb_checkpoint: the function returned NULL");
    c.mode = 6;
    c.foreign = nb_mul_scalar(x, 2);
    expect_error(nb_checkpoint(small_fn, &c, 1, &x), "nb_checkpoint: the function reads a tensor "
                 "of shape (2,3) made by nb_mul_scalar", "pass it in inputs");
    /* draws inside nb_parallel_for's ranges, on 1 and 2 threads (with grain
     * 1 the caller runs some ranges itself): refused, as their order varies;
     * ranges without draws, and draws in ranges outside a checkpoint, run */
    for (int threads = 1; threads <= 2; threads++) {
        nb_set_num_threads(threads);
        c.mode = 7;
        expect_error(nb_checkpoint(small_fn, &c, 1, &x), "nb_checkpoint: random numbers were "
                     "drawn inside nb_parallel_for's ranges, which cannot be replayed",
                     "draw on the function's own thread, outside nb_parallel_for");
        nb_tensor *y7 = small_fn(&x, 1, &c);
        ck_assert_msg(y7, "%s", nb_last_error());
        ck_assert_int_eq(nb_backward(nb_sum_all(y7)), 0);
        c.mode = 8;
        y7 = nb_checkpoint(small_fn, &c, 1, &x);
        ck_assert_msg(y7, "%s", nb_last_error());
        ck_assert_int_eq(nb_backward(nb_sum_all(y7)), 0);
    }
    nb_set_num_threads(0);

    /* backward: draws that differ, a shape that differs */
    c.mode = 4, c.calls = 0;
    nb_tensor *y = nb_checkpoint(small_fn, &c, 1, &x);
    ck_assert_ptr_nonnull(y);
    expect_error_rc(nb_backward(nb_sum_all(y)), "nb_backward: nb_checkpoint's function drew random "
                    "numbers differently when run again in backward",
                    "it made 0 draws, the forward 1");
    c.mode = 5, c.calls = 0;
    y = nb_checkpoint(small_fn, &c, 1, &x);
    expect_error_rc(nb_backward(nb_sum_all(y)), "nb_checkpoint's function returned (3) f64 when run "
                    "again in backward, (2,4) f64 in the forward");

    /* in place after the forward: the input, then a parameter */
    c.mode = 0;
    nb_tensor *x2 = randn64(NB_SHAPE(2, 3), 2, true);
    y = nb_checkpoint(small_fn, &c, 1, &x2);
    nb_set_grad_enabled(false);
    ck_assert_int_eq(nb_copy_into(x2, nb_mul_scalar(x2, 2)), 0);
    nb_set_grad_enabled(true);
    expect_error_rc(nb_backward(nb_sum_all(y)), "nb_backward: input 0 of nb_checkpoint was modified "
                    "in place after the forward");
    y = nb_checkpoint(small_fn, &c, 1, &x);
    nb_set_grad_enabled(false);
    ck_assert_int_eq(nb_copy_into(c.w, nb_mul_scalar(c.w, 0.5)), 0);
    nb_set_grad_enabled(true);
    expect_error_rc(nb_backward(nb_sum_all(y)), "a tensor of shape (3,4) that nb_checkpoint's "
                    "function reads through its context (a parameter) was modified in place "
                    "after the forward");

    /* create_graph and forward mode */
    y = nb_checkpoint(small_fn, &c, 1, &x);
    nb_tensor *gx = NULL, *s = nb_sum_all(y);
    expect_error_rc(nb_autograd_grad(&s, 1, NULL, &x, 1, &(nb_backward_opts){.create_graph = true},
                                     &gx),
                    "create_graph through nb_checkpoint is not supported");
    nb_scope_end();
}
END_TEST

Suite *suite_recompute(void) {
    Suite *s = suite_create("recompute");
    TCase *tc = tcase_create("recompute");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gpt_blocks_bitwise);
    tcase_add_test(tc, test_gpt_memory_kept);
    tcase_add_test(tc, test_gradcheck_through);
    tcase_add_test(tc, test_ctx_leaves);
    tcase_add_test(tc, test_forward_mode);
    tcase_add_test(tc, test_no_grad);
    tcase_add_test(tc, test_custom_function_inside);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    return s;
}
