/* test_transformer.c: the whole encoder-decoder: every parameter's gradient
 * through one full step checked by finite differences, PyTorch-style names,
 * and a short copy-task training run whose loss must fall. */
#include "test_util.h"

#include <stdlib.h>

static nb_TransformerConfig tiny = {.src_vocab = 5, .tgt_vocab = 5, .d_model = 4, .d_ff = 6,
                                    .heads = 2, .layers = 1, .max_len = 8, .dropout = 0.0};

typedef struct {
    nb_Transformer *m;
    nb_tensor *src, *tgt_in, *tgt_y, *src_keep, *tgt_keep;
} step_ctx;

/* The loss of one training step; the inputs are the model's own parameters,
 * which the model reads directly. */
static nb_tensor *step_loss(nb_tensor **in, int n, void *p) {
    (void)in;
    (void)n;
    step_ctx *c = p;
    nb_tensor *mem = nb_transformer_encode(c->m, c->src, c->src_keep, true, NULL);
    nb_tensor *out = nb_transformer_decode(c->m, mem, c->src_keep, c->tgt_in, c->tgt_keep, true,
                                           NULL);
    nb_tensor *logits = nb_reshape(nb_transformer_logits(c->m, out), NB_SHAPE(-1, 5));
    return nb_cross_entropy(logits, nb_reshape(c->tgt_y, NB_SHAPE(-1)), 0, 0.1);
}

START_TEST(whole_encoder_decoder_step_gradcheck) {
    nb_set_default_dtype(NB_F64);
    nb_params *ps = nb_params_new();
    nb_Transformer m;
    nb_rng r;
    nb_rng_seed(&r, 5);
    ck_assert_int_eq(nb_transformer_init(&m, ps, &tiny, &r), 0);
    /* batch 2: the second source ends in padding */
    nb_tensor *src = nb_from_data(NB_I64, NB_SHAPE(2, 3), (int64_t[]){1, 3, 4, 1, 2, 0});
    nb_tensor *tgt = nb_from_data(NB_I64, NB_SHAPE(2, 3), (int64_t[]){1, 3, 4, 1, 2, 2});
    nb_scope_begin();
    nb_tensor *zero = nb_full(NB_I64, 0, NULL, 0);
    step_ctx c = {&m, src, nb_narrow(tgt, 1, 0, 2), nb_narrow(tgt, 1, 1, 2),
                  nb_view(nb_ne(src, zero), NB_SHAPE(2, 1, 1, 3)), nb_tril_mask(2, 2)};
    int np = nb_params_count(ps);
    nb_tensor **params = malloc((size_t)np * sizeof *params);
    for (int i = 0; i < np; i++) params[i] = nb_params_at(ps, i, NULL);
    expect_gradcheck("transformer step (all parameters, enc-dec, masks)", step_loss, &c, np, params);
    free(params);
    nb_scope_end();
    nb_free(src);
    nb_free(tgt);
    nb_transformer_free(&m);
    nb_params_free(ps);
    nb_set_default_dtype(NB_F32);
}
END_TEST

START_TEST(parameter_names_follow_pytorch) {
    int64_t base = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_Transformer m;
    nb_TransformerConfig cfg = tiny;
    cfg.layers = 2;
    ck_assert_int_eq(nb_transformer_init(&m, ps, &cfg, NULL), 0);
    const char *names[] = {"src_embed.weight", "tgt_embed.weight",
                           "encoder.layers.0.self_attn.w_q.weight",
                           "encoder.layers.1.feed_forward.w_2.bias",
                           "encoder.layers.1.norm2.weight", "decoder.layers.0.src_attn.w_o.weight",
                           "decoder.layers.1.norm3.bias", "encoder.norm.weight",
                           "decoder.norm.bias", "generator.weight", "generator.bias"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        ck_assert_msg(nb_params_get(ps, names[i]) != NULL, "missing %s", names[i]);
    /* embeddings 2x5x4; per layer: enc 4*20 + 2*(4*6+6) (ff: 24+6 and 24+4) ... count all */
    int64_t d = 4, f = 6, v = 5;
    int64_t mha = 4 * (d * d + d), ff = d * f + f + f * d + d, ln = 2 * d;
    int64_t want = 2 * v * d + 2 * (mha + ff + 2 * ln) + 2 * (2 * mha + ff + 3 * ln) + 2 * ln +
                   d * v + v;
    ck_assert_int_eq(nb_params_numel(ps), want);
    ck_assert_ptr_null(nb_params_get(ps, "encoder.layers.2.norm1.weight"));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "encoder.layers.2.norm1.weight"));
    nb_clear_error();
    nb_transformer_free(&m);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(bad_config_is_an_error) {
    nb_params *ps = nb_params_new();
    nb_Transformer m;
    nb_TransformerConfig cfg = tiny;
    cfg.heads = 3; /* 4 % 3 != 0 */
    ck_assert_int_eq(nb_transformer_init(&m, ps, &cfg, NULL), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "divisible"));
    nb_clear_error();
    cfg = tiny;
    cfg.layers = 0;
    ck_assert_int_eq(nb_transformer_init(&m, ps, &cfg, NULL), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "layers 0"));
    nb_clear_error();
    nb_params_free(ps);
}
END_TEST

/* 60 Adam steps on the copy task at a small size: the loss must fall well
 * below its starting value (log 10 = 2.3 for a uniform guess). */
START_TEST(short_copy_task_run_learns) {
    nb_params *ps = nb_params_new();
    nb_Transformer m;
    nb_TransformerConfig cfg = {.src_vocab = 11, .tgt_vocab = 11, .d_model = 32, .d_ff = 64,
                                .heads = 2, .layers = 1, .max_len = 16, .dropout = 0.0};
    nb_rng r, data;
    nb_rng_seed(&r, 1);
    nb_rng_seed(&data, 2);
    ck_assert_int_eq(nb_transformer_init(&m, ps, &cfg, &r), 0);
    nb_optim *opt = nb_adam(ps, 3e-3, 0.9, 0.98, 1e-9, 0.0);
    ck_assert_ptr_nonnull(opt);
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        nb_scope_begin();
        nb_tensor *u = nb_rand(NB_F64, NB_SHAPE(32, 6), &data);
        nb_tensor *seq = nb_empty(NB_I64, NB_SHAPE(32, 6));
        const double *pu = nb_data(u);
        int64_t *p = nb_data(seq);
        for (int i = 0; i < 32 * 6; i++) p[i] = i % 6 == 0 ? 1 : 1 + (int64_t)(pu[i] * 10);
        nb_tensor *tin = nb_narrow(seq, 1, 0, 5), *ty = nb_narrow(seq, 1, 1, 5);
        nb_tensor *mem = nb_transformer_encode(&m, seq, NULL, true, NULL);
        nb_tensor *out = nb_transformer_decode(&m, mem, NULL, tin, nb_tril_mask(5, 5), true, NULL);
        nb_tensor *logits = nb_reshape(nb_transformer_logits(&m, out), NB_SHAPE(-1, 11));
        nb_tensor *loss = nb_cross_entropy(logits, nb_reshape(ty, NB_SHAPE(-1)), 0, 0.0);
        ck_assert_msg(loss != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_backward(loss), 0);
        nb_optim_step(opt);
        nb_optim_zero_grad(opt);
        if (step == 0) first = nb_item(loss);
        last = nb_item(loss);
        nb_scope_end();
    }
    printf("copy task, 60 steps at d_model 32: loss %.3f -> %.3f\n", first, last);
    ck_assert_msg(first > 2.0 && last < 0.6 * first, "loss %.3f -> %.3f", first, last);
    nb_optim_free(opt);
    nb_transformer_free(&m);
    nb_params_free(ps);
}
END_TEST


START_TEST(positional_encoding_matches_pytorch) {
    nb_tensor *want7 = fx("transformer.txt", "pe_7_6"), *want50 = fx("transformer.txt", "pe_50_64");
    nb_tensor *pe7 = nb_positional_encoding(7, 6, NB_F64);
    nb_tensor *pe50 = nb_positional_encoding(50, 64, NB_F64);
    nb_tensor *pe50f = nb_positional_encoding(50, 64, NB_F32);
    expect_close(pe7, want7, 1e-12, 1e-12);
    expect_close(pe50, want50, 1e-12, 1e-12);
    expect_close(pe50f, want50, 1e-6, 1e-6);
    ck_assert_int_eq(nb_dtype_of(pe50f), NB_F32);
    nb_free(pe7);
    nb_free(pe50);
    nb_free(pe50f);
    expect_error(nb_positional_encoding(0, 4, NB_F32), "nb_positional_encoding", "max_len 0");
    expect_error(nb_positional_encoding(4, -2, NB_F32), "nb_positional_encoding", "d_model -2");
}
END_TEST

START_TEST(xavier_init_bounds_and_errors) {
    nb_rng r;
    nb_rng_seed(&r, 9);
    nb_tensor *w = nb_zeros(NB_F64, NB_SHAPE(40, 60));
    ck_assert_int_eq(nb_init_xavier_uniform(w, &r), 0);
    double bound = sqrt(6.0 / (40 + 60)), lo = 1, hi = -1, sum = 0;
    double *v = values(w);
    for (int i = 0; i < 2400; i++) {
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
        sum += v[i];
    }
    free(v);
    ck_assert(lo >= -bound && hi <= bound);
    ck_assert_msg(lo < -0.95 * bound && hi > 0.95 * bound, "range [%g, %g] of +-%g", lo, hi, bound);
    ck_assert_msg(fabs(sum / 2400) < 0.02, "mean %g", sum / 2400);
    nb_tensor *b = nb_zeros(NB_F64, NB_SHAPE(5));
    ck_assert_int_eq(nb_init_xavier_uniform(b, &r), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_init_xavier_uniform: needs a tensor of 2"));
    nb_clear_error();
    nb_free(w);
    nb_free(b);
}
END_TEST

START_TEST(feedforward_and_persistent_errors) {
    nb_params *ps = nb_params_new();
    nb_FeedForward ff;
    ck_assert_int_eq(nb_feedforward_init(&ff, ps, "ff", 4, 8, 1.5, NULL), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_feedforward_init: dropout must be in [0, 1], got 1.5"));
    nb_clear_error();
    ck_assert_int_eq(nb_params_count(ps), 0);
    expect_error(nb_persistent(NULL), "nb_persistent: input 0 is NULL");
    /* a persistent handle outlives the scope its source was made in */
    int64_t base = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *p = nb_persistent(nb_full(NB_F32, NB_SHAPE(3), 2.0));
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), base + 1);
    nb_scope_begin();
    ck_assert_double_eq(nb_item(nb_select(p, 0, 2)), 2.0);
    nb_scope_end();
    nb_free(p);
    ck_assert_int_eq(nb_live_tensors(), base);
    nb_params_free(ps);
}
END_TEST

Suite *suite_transformer(void) {
    Suite *s = suite_create("transformer");
    TCase *tc = tcase_create("transformer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, whole_encoder_decoder_step_gradcheck);
    tcase_add_test(tc, parameter_names_follow_pytorch);
    tcase_add_test(tc, bad_config_is_an_error);
    tcase_add_test(tc, short_copy_task_run_learns);
    tcase_add_test(tc, positional_encoding_matches_pytorch);
    tcase_add_test(tc, xavier_init_bounds_and_errors);
    tcase_add_test(tc, feedforward_and_persistent_errors);
    suite_add_tcase(s, tc);
    return s;
}
