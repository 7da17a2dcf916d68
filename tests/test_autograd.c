/* test_autograd.c: the engine (accumulation, shared subgraphs, broadcast,
 * views, grad mode, detach, in-place checks, early frees, deep graphs),
 * nb_gradcheck itself (it must catch a wrong gradient and say where), and
 * what create_graph and nb_jvp must not lose (a sum's graph, a leaf .grad
 * a graph was recorded from, a tangent rule, a once-differentiable refusal). */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static nb_tensor *vec(int n, const double *v) {
    return nb_from_data(NB_F64, 1, (const int64_t[]){n}, v);
}

static void expect_values(const nb_tensor *t, int n, const double *want, double tol) {
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(nb_numel(t), n);
    double got[64];
    nb_copy_to_f64(t, got);
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= tol, "element %d: %.12g, expected %.12g", i,
                      got[i], want[i]);
}

START_TEST(accumulates_across_backward_calls) {
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    for (int k = 1; k <= 2; k++) {
        nb_scope_begin();
        ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(x, x))), 0);
        nb_scope_end();
        expect_values(nb_grad(x), 3, (double[]){2.0 * k, 4.0 * k, 6.0 * k}, 0);
    }
    nb_zero_grad(x);
    expect_values(nb_grad(x), 3, (double[]){0, 0, 0}, 0);
    nb_free(x);
}
END_TEST

/* y = a*a + a with a = exp(x) used three times: dy/dx = (2a + 1) a */
START_TEST(shared_subexpression) {
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){0.5, -1}), true);
    nb_scope_begin();
    nb_tensor *a = nb_exp(x);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_add(nb_mul(a, a), a))), 0);
    nb_scope_end();
    double a0 = exp(0.5), a1 = exp(-1.0);
    expect_values(nb_grad(x), 2, (double[]){(2 * a0 + 1) * a0, (2 * a1 + 1) * a1}, 1e-12);
    nb_free(x);
}
END_TEST

START_TEST(broadcast_gradients_sum_back) {
    nb_tensor *a = nb_set_requires_grad(nb_ones(NB_F64, NB_SHAPE(3, 1)), true);
    nb_tensor *b = nb_set_requires_grad(vec(4, (double[]){1, 2, 3, 4}), true);
    nb_scope_begin();
    nb_tensor *y = nb_mul(a, b); /* (3,4) */
    ck_assert_int_eq(nb_ndim(y), 2);
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_ndim(nb_grad(a)), 2);
    expect_values(nb_grad(a), 3, (double[]){10, 10, 10}, 0);
    expect_values(nb_grad(b), 4, (double[]){3, 3, 3, 3}, 0);
    nb_free(a);
    nb_free(b);
}
END_TEST

START_TEST(gradient_through_views_reaches_leaf) {
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(2, 3),
                                                     (double[]){1, 2, 3, 4, 5, 6}), true);
    nb_scope_begin();
    /* y = sum(w * x^T) with w = [[1,2],[3,4],[5,6]] -> dx = w^T */
    nb_tensor *w = nb_from_data(NB_F64, NB_SHAPE(3, 2), (double[]){1, 2, 3, 4, 5, 6});
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(nb_transpose(x, 0, 1), w))), 0);
    nb_scope_end();
    expect_values(nb_grad(x), 6, (double[]){1, 3, 5, 2, 4, 6}, 0);
    ck_assert(nb_is_contiguous(nb_grad(x)));
    nb_free(x);
}
END_TEST

START_TEST(backward_with_grad_for_non_scalar) {
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    nb_scope_begin();
    nb_tensor *y = nb_mul_scalar(x, 3);
    ck_assert_int_eq(nb_backward_with_grad(y, vec(3, (double[]){1, 10, 100})), 0);
    expect_error_rc(nb_backward(y), "nb_backward", "one element", "(3)");
    nb_tensor *wrong = nb_zeros(NB_F64, NB_SHAPE(2));
    ck_assert_int_eq(nb_backward_with_grad(y, wrong), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "does not match"));
    nb_clear_error();
    nb_scope_end();
    expect_values(nb_grad(x), 3, (double[]){3, 30, 300}, 0);
    nb_free(x);
}
END_TEST

START_TEST(grad_mode_off_records_nothing) {
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    nb_scope_begin();
    nb_set_grad_enabled(false);
    ck_assert(!nb_grad_enabled());
    nb_tensor *y = nb_sum_all(nb_mul(x, x));
    nb_set_grad_enabled(true);
    ck_assert(!nb_requires_grad(y));
    ck_assert(nb_is_leaf(y));
    ck_assert_int_eq(nb_backward(y), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "does not require grad"));
    nb_clear_error();
    nb_scope_end();
    ck_assert_ptr_null(nb_grad(x));
    nb_free(x);
}
END_TEST

START_TEST(detach_shares_storage_and_stops_gradient) {
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    nb_scope_begin();
    nb_tensor *d = nb_detach(nb_mul_scalar(x, 2));
    ck_assert(!nb_requires_grad(d));
    nb_tensor *y = nb_sum_all(nb_add(nb_mul(d, x), x)); /* dy/dx = d + 1 */
    ck_assert_int_eq(nb_backward(y), 0);
    nb_scope_end();
    expect_values(nb_grad(x), 2, (double[]){3, 5}, 0);
    nb_scope_begin();
    nb_tensor *dx = nb_detach(x);
    ck_assert_ptr_eq(nb_data(dx), nb_data(x));
    nb_scope_end();
    nb_free(x);
}
END_TEST

START_TEST(in_place_change_of_saved_input_is_caught) {
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    nb_tensor *w = vec(2, (double[]){3, 4});
    nb_scope_begin();
    nb_tensor *y = nb_sum_all(nb_mul(x, w));
    ck_assert_int_eq(nb_copy_into(w, nb_scalar(NB_F64, 0)), 0);
    ck_assert_int_eq(nb_backward(y), -1);
    const char *e = nb_last_error();
    ck_assert_ptr_nonnull(strstr(e, "nb_mul"));
    ck_assert_ptr_nonnull(strstr(e, "modified in place"));
    nb_clear_error();
    /* nb_add does not read its inputs in backward: no false alarm */
    nb_tensor *z = nb_sum_all(nb_add(x, w));
    ck_assert_int_eq(nb_copy_into(w, nb_scalar(NB_F64, 1)), 0);
    ck_assert_int_eq(nb_backward(z), 0);
    nb_scope_end();
    nb_free(x);
    nb_free(w);
}
END_TEST


/* Writes through nb_data are invisible to autograd until nb_mark_modified. */
START_TEST(mark_modified_invalidates_saved_tensors) {
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    nb_tensor *w = vec(2, (double[]){3, 4});
    nb_scope_begin();
    nb_tensor *y = nb_sum_all(nb_mul(x, w));
    ((double *)nb_data(w))[0] = 5;
    nb_mark_modified(w);
    ck_assert_int_eq(nb_backward(y), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "input 1 of nb_mul was modified in place"));
    nb_clear_error();
    nb_scope_end();
    ck_assert_ptr_null(nb_grad(x));
    nb_mark_modified(NULL); /* harmless */
    nb_free(x);
    nb_free(w);
}
END_TEST

/* nb_write_version counts in-place writes of a storage: nb_copy_into,
 * nb_mark_modified and an optimizer step each add one, views share the
 * count, and reading (nb_data without a mark, an op) adds none. */
START_TEST(write_version_counts_writes) {
    nb_tensor *w = nb_set_requires_grad(vec(4, (double[]){1, 2, 3, 4}), true);
    ck_assert_uint_eq(nb_write_version(w), 0);
    nb_scope_begin();
    nb_tensor *v = nb_narrow(w, 0, 1, 2);
    nb_tensor *y = nb_sum_all(nb_mul(w, w));
    (void)nb_data(w);
    ck_assert_uint_eq(nb_write_version(w), 0);
    ck_assert_int_eq(nb_copy_into(v, nb_scalar(NB_F64, 7)), 0);
    ck_assert_uint_eq(nb_write_version(w), 1);
    ck_assert_uint_eq(nb_write_version(v), 1);
    nb_mark_modified(v);
    ck_assert_uint_eq(nb_write_version(w), 2);
    nb_scope_end();
    (void)y;
    nb_params *ps = nb_params_new();
    nb_tensor *mine = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    nb_tensor *p = nb_params_add(ps, "p", mine);
    nb_optim *opt = nb_sgd(ps, 0.1, 0.0, 0.0);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(p, p))), 0);
    nb_scope_end();
    uint64_t before = nb_write_version(p);
    nb_optim_step(opt);
    ck_assert_uint_eq(nb_write_version(p), before + 1);
    ck_assert_uint_eq(nb_write_version(NULL), 0);
    ck_assert_str_eq(nb_last_error(), "nb_write_version: input 0 is NULL");
    nb_clear_error();
    nb_optim_free(opt);
    nb_params_free(ps);
    nb_free(mine);
    nb_free(w);
}
END_TEST

START_TEST(requires_grad_rules) {
    nb_tensor *i = nb_arange(NB_I64, 3);
    expect_error(nb_set_requires_grad(i, true), "nb_set_requires_grad", "floating", "i64");
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1, 2}), true);
    ck_assert(nb_is_leaf(x));
    nb_scope_begin();
    nb_tensor *y = nb_exp(x);
    ck_assert(!nb_is_leaf(y));
    ck_assert_ptr_eq(nb_set_requires_grad(y, true), y);
    expect_error(nb_set_requires_grad(y, false), "nb_set_requires_grad", "nb_exp", "nb_detach");
    nb_scope_end();
    nb_free(x);
    nb_free(i);
}
END_TEST

/* Tensors freed early live on while a graph needs them. */
START_TEST(graph_keeps_freed_intermediates_alive) {
    int64_t base = nb_live_tensors();
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){0, 1}), true);
    nb_tensor *h = nb_exp(x);
    nb_tensor *y = nb_sum_all(h);
    nb_free(h); /* y's graph still holds it */
    ck_assert_int_eq(nb_backward(y), 0);
    expect_values(nb_grad(x), 2, (double[]){1, exp(1.0)}, 1e-12);
    nb_free(y); /* releases h too */
    nb_free(x);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(deep_chain_does_not_overflow_the_stack) {
    int64_t base = nb_live_tensors();
    nb_tensor *x = nb_set_requires_grad(nb_scalar(NB_F64, 1.0), true);
    nb_scope_begin();
    nb_tensor *y = x;
    for (int k = 0; k < 200000; k++) y = nb_add_scalar(y, 1e-6);
    ck_assert_int_eq(nb_backward(y), 0);
    nb_scope_end();
    ck_assert_double_eq(nb_item(nb_grad(x)), 1.0);
    /* the same chain made persistent and freed from its head */
    y = x;
    for (int k = 0; k < 200000; k++) {
        nb_tensor *next = nb_add_scalar(y, 1e-6);
        if (y != x) nb_free(y); /* still held by next's graph node */
        y = next;
    }
    nb_free(y);
    nb_free(x);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(f32_gradients_are_f32) {
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_F32, NB_SHAPE(2, 2), 2.0), true);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_mean_all(nb_pow_scalar(x, 3))), 0);
    nb_scope_end();
    ck_assert_int_eq(nb_dtype_of(nb_grad(x)), NB_F32);
    expect_values(nb_grad(x), 4, (double[]){3, 3, 3, 3}, 1e-6); /* 3 x^2 / 4 */
    nb_free(x);
}
END_TEST

/* ---------------------------------------------------------- gradcheck */
static nb_tensor *relu_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_relu(in[0]);
}

static nb_tensor *mul_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_mul(in[0], in[1]);
}

START_TEST(gradcheck_reports_the_worst_element) {
    /* relu at exactly 0: analytic 0, central difference 0.5 */
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 0, -2}), true);
    nb_gradcheck_result r;
    ck_assert(!nb_gradcheck(relu_fn, NULL, 1, &x, NULL, &r));
    ck_assert(!r.ok);
    ck_assert_int_eq(r.input, 0);
    ck_assert_int_eq(r.index, 1);
    ck_assert_int_eq(r.output_index, 1);
    ck_assert_double_eq_tol(r.analytic, 0.0, 1e-15);
    ck_assert_double_eq_tol(r.numeric, 0.5, 1e-9);
    ck_assert_int_eq(r.checked, 9);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "MISMATCH"));
    ck_assert_ptr_nonnull(strstr(r.message, "element 1"));
    nb_clear_error();
    /* values are restored */
    expect_values(x, 3, (double[]){1, 0, -2}, 0);
    nb_free(x);
}
END_TEST

START_TEST(gradcheck_passes_and_restores_state) {
    nb_tensor *in[2] = {rand_leaf(1, NB_SHAPE(2, 3)), rand_leaf(2, NB_SHAPE(3))};
    double before[6];
    nb_copy_to_f64(in[0], before);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(in[0], in[1]))), 0);
    nb_scope_end();
    nb_tensor *g0 = nb_grad(in[0]);
    double g0v[6];
    nb_copy_to_f64(g0, g0v);
    nb_gradcheck_result r;
    ck_assert(nb_gradcheck(mul_fn, NULL, 2, in, NULL, &r));
    ck_assert(r.ok);
    ck_assert_int_eq(r.checked, 6 * 6 + 3 * 6);
    ck_assert(r.max_abs_err < 1e-8);
    expect_values(in[0], 6, before, 0);
    ck_assert_ptr_eq(nb_grad(in[0]), g0); /* earlier gradient put back untouched */
    expect_values(nb_grad(in[0]), 6, g0v, 0);
    expect_gradcheck("nb_mul (gradcheck self-test)", mul_fn, NULL, 2, in);
    nb_free(in[0]);
    nb_free(in[1]);
}
END_TEST

START_TEST(gradcheck_rejects_bad_inputs) {
    nb_tensor *f = nb_set_requires_grad(nb_ones(NB_F32, NB_SHAPE(2)), true);
    ck_assert(!nb_gradcheck(relu_fn, NULL, 1, &f, NULL, NULL));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "f64"));
    nb_clear_error();
    nb_tensor *plain = nb_ones(NB_F64, NB_SHAPE(2));
    ck_assert(!nb_gradcheck(relu_fn, NULL, 1, &plain, NULL, NULL));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "no input requires grad"));
    nb_clear_error();
    nb_tensor *e = nb_set_requires_grad(nb_expand(plain, NB_SHAPE(3, 2)), true);
    ck_assert(!nb_gradcheck(relu_fn, NULL, 1, &e, NULL, NULL));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "overlapping"));
    nb_clear_error();
    nb_gradcheck_opts bad = {.eps = 0, .atol = 1e-5, .rtol = 1e-3};
    nb_set_requires_grad(plain, true);
    ck_assert(!nb_gradcheck(relu_fn, NULL, 1, &plain, &bad, NULL));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "eps"));
    nb_clear_error();
    nb_free(e);
    nb_free(plain);
    nb_free(f);
}
END_TEST


/* ------------------------------------------------------- anomaly mode */
static nb_tensor *leaf(const double *v, int64_t n) {
    return nb_set_requires_grad(nb_from_data(NB_F64, 1, &n, v), true);
}

START_TEST(anomaly_names_the_forward_op) {
    ck_assert(!nb_detect_anomaly()); /* off at start */
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){1.0, -2.0, 3.0}, 3);
    nb_tensor *y = nb_log(x); /* NaN at element 1, allowed when off */
    ck_assert_ptr_nonnull(y);
    ck_assert(isnan(nb_item(nb_select(y, 0, 1))));
    int64_t live = nb_live_tensors();
    nb_set_detect_anomaly(true);
    ck_assert(nb_detect_anomaly());
    expect_error(nb_log(x), "nb_log: anomaly detected: the forward produced NaN at element 1",
                 "(shape (3)) from finite inputs");
    ck_assert_int_eq(nb_live_tensors(), live); /* the failed output was freed */
    nb_tensor *big = leaf((double[]){1.0, 800.0}, 2);
    expect_error(nb_exp(big), "nb_exp", "produced Inf at element 1");
    expect_error(nb_div(x, nb_sub(x, x)), "nb_div", "produced Inf at element 0");
    /* a NaN made with grad off is blamed on where it came from */
    nb_set_grad_enabled(false);
    nb_tensor *data = nb_log(nb_from_data(NB_F64, NB_SHAPE(3), (double[]){-1.0, 1.0, 1.0}));
    nb_set_grad_enabled(true);
    expect_error(nb_mul(x, data), "nb_mul: anomaly detected: input 1 (shape (3)) holds NaN at "
                 "element 0", "made with grad off or given as data");
    /* finite work, views and masked_fill with -inf (attention) pass */
    nb_tensor *keep = nb_tril_mask(3, 3);
    nb_tensor *w = nb_mul(nb_unsqueeze(x, 0), nb_unsqueeze(x, 1));
    nb_tensor *p = nb_softmax(nb_masked_fill(w, nb_logical_not(keep), -INFINITY), -1);
    ck_assert_msg(p && nb_backward(nb_sum_all(nb_mul(p, p))) == 0, "%s", nb_last_error());
    nb_set_detect_anomaly(false);
    nb_scope_end();
}
END_TEST

START_TEST(anomaly_names_the_backward_op) {
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){0.0, 4.0}, 2);
    nb_set_detect_anomaly(true);
    /* sqrt(0) is finite, its derivative 1/(2 sqrt(0)) is not */
    nb_tensor *y = nb_sqrt(x);
    ck_assert_ptr_nonnull(y);
    expect_error_rc(nb_backward(nb_sum_all(y)), "nb_backward: anomaly detected: the backward of "
                    "nb_sqrt produced Inf at element 0 of the gradient of input 0 (shape (2))",
                    "the gradient it received was finite");
    ck_assert_ptr_null(nb_grad(x)); /* nothing reached the leaf */
    /* times 0 first: the gradient reaching sqrt is 0, and 0 * Inf is NaN */
    nb_tensor *z = nb_mul_scalar(nb_sqrt(x), 0.0);
    expect_error_rc(nb_backward(nb_sum_all(z)), "the backward of nb_sqrt produced NaN");
    nb_tensor *bad = nb_from_data(NB_F64, NB_SHAPE(2), (double[]){1.0, NAN});
    expect_error_rc(nb_backward_with_grad(y, bad), "nb_backward_with_grad: anomaly detected: "
                    "the gradient given holds NaN at element 1");
    /* off: the same backward runs and leaves Inf in the gradient */
    nb_set_detect_anomaly(false);
    ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
    ck_assert(isinf(nb_item(nb_select(nb_grad(x), 0, 0))));
    nb_scope_end();
}
END_TEST

/* A transformer training step raises nothing in anomaly mode: its -inf
 * masks, softmax, dropout and cross entropy are all legitimate. */
/* Gradients reach a tensor as views (sum's is expanded, stride 0; transpose's
 * is permuted; nb_contiguous of a contiguous tensor passes its own on) and
 * add up in the walk and into .grad, for a non-leaf (t) and a leaf (x), in
 * both floating dtypes. loss = sum(t) + sum(t^T * w) + sum(contiguous(x)) +
 * sum(x), t = 2x: d loss/dx = 4 + 2 w^T, exactly (small integers). Big
 * enough that the sums are split across threads. */
START_TEST(accumulates_gradients_given_as_views) {
    enum { R = 256, C = 300 };
    double *w = malloc(sizeof(double) * R * C), *got = malloc(sizeof(double) * R * C);
    ck_assert(w && got);
    for (int j = 0; j < C; j++)
        for (int i = 0; i < R; i++) w[j * R + i] = (i * 7 + j) % 5;
    nb_dtype dts[2] = {NB_F32, NB_F64};
    for (int k = 0; k < 2; k++) {
        nb_tensor *x = nb_set_requires_grad(nb_full(dts[k], NB_SHAPE(R, C), 0.5), true);
        for (int call = 1; call <= 2; call++) {
            nb_scope_begin();
            nb_tensor *wt = nb_to(nb_from_data(NB_F64, NB_SHAPE(C, R), w), dts[k]);
            nb_tensor *t = nb_mul_scalar(x, 2);
            nb_tensor *tw = nb_mul(nb_transpose(t, 0, 1), wt);
            nb_tensor *loss = nb_add(nb_add(nb_sum_all(t), nb_sum_all(tw)),
                                     nb_add(nb_sum_all(nb_contiguous(x)), nb_sum_all(x)));
            ck_assert_msg(loss && nb_backward(loss) == 0, "%s", nb_last_error());
            nb_scope_end();
            ck_assert_int_eq(nb_copy_to_f64(nb_grad(x), got), 0);
            for (int i = 0; i < R; i++)
                for (int j = 0; j < C; j++)
                    ck_assert_msg(got[i * C + j] == call * (4 + 2 * w[j * R + i]),
                                  "%s, backward %d, grad[%d][%d] = %g, expected %g",
                                  nb_dtype_name(dts[k]), call, i, j, got[i * C + j],
                                  call * (4 + 2 * w[j * R + i]));
        }
        nb_free(x);
    }
    free(w);
    free(got);
}
END_TEST

START_TEST(anomaly_mode_is_quiet_on_a_transformer_step) {
    nb_params *ps = nb_params_new();
    nb_Transformer m;
    nb_TransformerConfig cfg = {.src_vocab = 7, .tgt_vocab = 7, .d_model = 16, .d_ff = 32,
                                .heads = 2, .layers = 1, .max_len = 16, .dropout = 0.1};
    nb_rng rng;
    nb_rng_seed(&rng, 4);
    ck_assert_int_eq(nb_transformer_init(&m, ps, &cfg, &rng), 0);
    nb_set_detect_anomaly(true);
    nb_scope_begin();
    int64_t tok[2 * 5] = {1, 2, 3, 4, 0, 1, 5, 6, 0, 0}; /* 0 pads */
    nb_tensor *src = nb_from_data(NB_I64, NB_SHAPE(2, 5), tok);
    nb_tensor *keep = nb_view(nb_ne(src, nb_full(NB_I64, 0, NULL, 0)), NB_SHAPE(2, 1, 1, 5));
    nb_tensor *mem = nb_transformer_encode(&m, src, keep, true, &rng);
    nb_tensor *out = nb_transformer_decode(&m, mem, keep, src, nb_tril_mask(5, 5), true, &rng);
    nb_tensor *logits = nb_reshape(nb_transformer_logits(&m, out), NB_SHAPE(-1, 7));
    nb_tensor *loss = nb_cross_entropy(logits, nb_reshape(src, NB_SHAPE(-1)), 0, 0.1);
    ck_assert_msg(loss && nb_backward(loss) == 0, "%s", nb_last_error());
    nb_scope_end();
    nb_set_detect_anomaly(false);
    nb_transformer_free(&m);
    nb_params_free(ps);
}
END_TEST

/* A tied embedding: w is picked by index_select (rows 2, 0, 2, 2 repeat) and
 * used whole by a product, so index_select's backward finds w's gradient
 * already summed and adds into it in place (nbi_grad_sink). Its bits must be
 * the dense path's: per row, the picked rows of g summed in order, then one
 * addition. Checked against that sum done here in float, and the first
 * .grad (which takes over the buffer) and a second backward (which adds). */
START_TEST(sparse_gradient_added_in_place_keeps_the_bits) {
    nb_rng r = {11, 0};
    nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F32, NB_SHAPE(4, 3), &r), true);
    nb_tensor *c = nb_randn(NB_F32, NB_SHAPE(4, 3), &r), *p = nb_randn(NB_F32, NB_SHAPE(4, 3), &r);
    const int64_t rows[4] = {2, 0, 2, 2};
    float want[12];
    const float *cv = nb_data(c), *pv = nb_data(p);
    for (int i = 0; i < 4; i++)
        for (int e = 0; e < 3; e++) {
            float sum = 0;
            bool any = false;
            for (int k = 0; k < 4; k++)
                if (rows[k] == i) sum = any ? sum + pv[k * 3 + e] : pv[k * 3 + e], any = true;
            want[i * 3 + e] = any ? cv[i * 3 + e] + sum : cv[i * 3 + e];
        }
    for (int pass = 0; pass < 2; pass++) {
        nb_scope_begin();
        nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(4), rows);
        /* in this order the product's gradient reaches w first */
        nb_tensor *loss = nb_add(nb_sum_all(nb_mul(nb_index_select(w, 0, idx), p)),
                                 nb_sum_all(nb_mul(w, c)));
        ck_assert_int_eq(nb_backward(loss), 0);
        nb_scope_end();
        const float *g = nb_data(nb_grad(w));
        for (int i = 0; i < 12; i++) {
            float exp = pass ? want[i] + want[i] : want[i];
            ck_assert_msg(memcmp(&g[i], &exp, sizeof exp) == 0, "pass %d, element %d: %.9g, expected %.9g",
                          pass, i, g[i], exp);
        }
    }
    nb_free(w);
    nb_free(c);
    nb_free(p);
}
END_TEST

/* A leaf's first .grad takes over the buffer of a gradient only backward
 * holds, never one of the caller's: backpropagating a leaf from a seed, the
 * seed's values stay as they were through two backward calls (the second
 * adds into .grad). */
START_TEST(caller_gradient_is_never_taken_over) {
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, 2, 3}), true);
    nb_tensor *g = nb_from_data(NB_F64, NB_SHAPE(3), (double[]){10, 20, 30});
    ck_assert_int_eq(nb_backward_with_grad(x, g), 0);
    ck_assert_int_eq(nb_backward_with_grad(x, g), 0);
    const double *gv = nb_data(g), *xg = nb_data(nb_grad(x));
    for (int i = 0; i < 3; i++) {
        ck_assert(gv[i] == 10.0 * (i + 1));
        ck_assert(xg[i] == 20.0 * (i + 1));
    }
    nb_free(x);
    nb_free(g);
}
END_TEST

/* ------------------------------------------------------ gradient-ready hooks */
typedef struct {
    int calls;
    nb_tensor *order[8];
    double seen[8][3]; /* the leaf's .grad when its hook ran */
    int fail;          /* 1: fail with a message, 2: fail without one */
} hook_log;

static int log_hook(nb_tensor *leaf, void *ctx) {
    hook_log *h = ctx;
    if (h->calls < 8) {
        h->order[h->calls] = leaf;
        nb_copy_to_f64(nb_grad(leaf), h->seen[h->calls]);
    }
    h->calls++;
    if (h->fail == 1) {
        nb_report_error("my_hook: boom on a leaf of %lld elements", (long long)nb_numel(leaf));
        return -1;
    }
    return h->fail == 2 ? -1 : 0;
}

/* Once per backward and leaf, after every path's gradient is in .grad (and
 * added to what it held), leaves finished last-used first; a leaf backward
 * does not reach is not called; NULL removes the hook. */
START_TEST(grad_hook_runs_once_when_the_gradient_is_complete) {
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    nb_tensor *w = nb_set_requires_grad(vec(3, (double[]){0.5, -1, 2}), true);
    nb_tensor *unused = nb_set_requires_grad(vec(3, (double[]){0, 0, 0}), true);
    hook_log h = {0};
    ck_assert_int_eq(nb_set_grad_hook(x, log_hook, &h), 0);
    ck_assert_int_eq(nb_set_grad_hook(w, log_hook, &h), 0);
    ck_assert_int_eq(nb_set_grad_hook(unused, log_hook, &h), 0);
    for (int k = 1; k <= 2; k++) {
        nb_scope_begin();
        /* y = sum(x*x + x) * ... then times w: x is used by the first ops, w last */
        nb_tensor *y = nb_sum_all(nb_mul(nb_add(nb_mul(x, x), x), w));
        ck_assert_int_eq(nb_backward(y), 0);
        nb_scope_end();
        ck_assert_int_eq(h.calls, 2 * k);
        ck_assert_ptr_eq(h.order[2 * k - 2], w); /* w's gradient is complete first */
        ck_assert_ptr_eq(h.order[2 * k - 1], x);
        for (int i = 0; i < 3; i++) { /* dy/dx = (2x + 1) w, dy/dw = x*x + x, times k */
            double xi = i + 1, wi = (double[]){0.5, -1, 2}[i];
            ck_assert(h.seen[2 * k - 1][i] == k * (2 * xi + 1) * wi);
            ck_assert(h.seen[2 * k - 2][i] == k * (xi * xi + xi));
        }
    }
    ck_assert_int_eq(nb_set_grad_hook(x, NULL, NULL), 0);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(x, w))), 0);
    nb_scope_end();
    ck_assert_int_eq(h.calls, 5); /* w only */
    ck_assert_ptr_eq(h.order[4], w);
    nb_free(x);
    nb_free(w);
    nb_free(unused);
}
END_TEST

/* A failing hook stops backward with its message (or one naming the hook
 * when it gave none); setting a hook on a non-leaf or a freed tensor fails. */
START_TEST(grad_hook_errors) {
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    hook_log h = {.fail = 1};
    ck_assert_int_eq(nb_set_grad_hook(x, log_hook, &h), 0);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(x, x))), -1);
    ck_assert_str_eq(nb_last_error(), "my_hook: boom on a leaf of 3 elements");
    h.fail = 2;
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(x, x))), -1);
    ck_assert_str_eq(nb_last_error(), "nb_backward: the gradient-ready hook of a leaf of shape "
                                      "(3) failed without a message (report one with "
                                      "nb_report_error)");
    nb_tensor *y = nb_mul(x, x);
    ck_assert_int_eq(nb_set_grad_hook(y, log_hook, &h), -1);
    ck_assert_str_eq(nb_last_error(), "nb_set_grad_hook: this tensor of shape (3) was made by "
                                      "nb_mul and is not a leaf; hooks go on leaves (parameters)");
    nb_scope_end();
    ck_assert_int_eq(h.calls, 2);
    nb_tensor *c = vec(3, (double[]){1, 2, 3}); /* a constant: backward never reaches it */
    ck_assert_int_eq(nb_set_grad_hook(c, log_hook, &h), -1);
    ck_assert_str_eq(nb_last_error(), "nb_set_grad_hook: this tensor of shape (3) does not "
                                      "require grad, so backward never reaches it and its hook "
                                      "would never run (nb_set_requires_grad first)");
    ck_assert_int_eq(nb_set_grad_hook(c, NULL, NULL), 0); /* removing is always fine */
    nb_free(c);
    nb_free(x);
    ck_assert_int_eq(nb_set_grad_hook(x, log_hook, &h), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "freed"));
}
END_TEST

/* ----------------------------------------------- gradient contribution hooks */
typedef struct {
    int calls, fail;
    nb_tensor *leaf;
    double seen[4][6]; /* nb_grad_so_far when the hook ran */
    bool grad_was_null[4];
} contrib_log;

static int contrib_hook(nb_tensor *leaf, void *ctx) {
    contrib_log *h = ctx;
    nb_tensor *so_far = nb_grad_so_far(leaf);
    ck_assert_ptr_nonnull(so_far);
    ck_assert_ptr_null(nb_grad_so_far(h->leaf == leaf ? NULL : h->leaf));
    if (h->calls < 4) {
        nb_copy_to_f64(so_far, h->seen[h->calls]);
        h->grad_was_null[h->calls] = nb_grad(leaf) == NULL;
    }
    h->calls++;
    return h->fail ? -1 : 0;
}

/* A weight tied between an embedding and an output layer, as GPT-2's: the
 * output layer's part first (backward meets it first), then the whole, with
 * the embedding's part added in place (nbi_grad_sink); .grad is set only
 * after. Outside a hook, nb_grad_so_far is NULL. */
START_TEST(contribution_hook_sees_each_part_of_a_tied_weight) {
    /* w (3,2) rows = tokens; idx [2, 0]; e = w[idx] (2,2); logits = e w^T (2,3) */
    double wv[6] = {1, 2, -1, 0.5, 3, -2}, ev[4] = {3, -2, 1, 2}, lg[6], part[6] = {0}, ge[4] = {0};
    nb_tensor *w = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3, 2), wv), true);
    nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(2), (int64_t[]){2, 0});
    contrib_log h = {.leaf = w};
    ck_assert_int_eq(nb_set_grad_contribution_hook(w, contrib_hook, &h), 0);
    nb_scope_begin();
    nb_tensor *logits = nb_linear(nb_embedding(w, idx), w, NULL);
    ck_assert_ptr_null(nb_grad_so_far(w));
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(logits, logits))), 0);
    nb_scope_end();
    ck_assert_int_eq(h.calls, 2);
    ck_assert(h.grad_was_null[0] && h.grad_was_null[1]);
    /* output layer: dL/dw[v] = sum_r 2 lg[r][v] e[r]; embedding: dL/de[r] = sum_v 2 lg[r][v] w[v] */
    for (int r = 0; r < 2; r++)
        for (int v = 0; v < 3; v++) lg[r * 3 + v] = ev[r * 2] * wv[v * 2] + ev[r * 2 + 1] * wv[v * 2 + 1];
    for (int r = 0; r < 2; r++)
        for (int v = 0; v < 3; v++)
            for (int c = 0; c < 2; c++) {
                part[v * 2 + c] += 2 * lg[r * 3 + v] * ev[r * 2 + c];
                ge[r * 2 + c] += 2 * lg[r * 3 + v] * wv[v * 2 + c];
            }
    double full[6];
    nb_copy_to_f64(nb_grad(w), full);
    for (int i = 0; i < 6; i++) {
        ck_assert(h.seen[0][i] == part[i]);
        ck_assert(h.seen[1][i] == full[i]);
    }
    double emb[6] = {ge[2], ge[3], 0, 0, ge[0], ge[1]}; /* rows 2 and 0 */
    for (int i = 0; i < 6; i++) ck_assert(full[i] == part[i] + emb[i]);
    /* a backward started at the leaf itself: its seed is a contribution */
    nb_clear_grad(w);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward_with_grad(w, nb_full(NB_F64, NB_SHAPE(3, 2), 0.5)), 0);
    nb_scope_end();
    ck_assert_int_eq(h.calls, 3);
    for (int i = 0; i < 6; i++) ck_assert(h.seen[2][i] == 0.5);
    ck_assert_int_eq(nb_set_grad_contribution_hook(w, NULL, NULL), 0);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_embedding(w, idx))), 0);
    nb_scope_end();
    ck_assert_int_eq(h.calls, 3);
    nb_free(idx);
    nb_free(w);
}
END_TEST

START_TEST(contribution_hook_errors) {
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    contrib_log h = {.leaf = x, .fail = 1};
    ck_assert_int_eq(nb_set_grad_contribution_hook(x, contrib_hook, &h), 0);
    nb_scope_begin();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(x, x))), -1);
    ck_assert_str_eq(nb_last_error(), "nb_backward: the gradient contribution hook of a leaf of "
                                      "shape (3) failed without a message (report one with "
                                      "nb_report_error)");
    ck_assert_int_eq(h.calls, 1);
    ck_assert_ptr_null(nb_grad(x));
    nb_tensor *y = nb_mul(x, x);
    ck_assert_int_eq(nb_set_grad_contribution_hook(y, contrib_hook, &h), -1);
    ck_assert_str_eq(nb_last_error(), "nb_set_grad_contribution_hook: this tensor of shape (3) "
                                      "was made by nb_mul and is not a leaf; hooks go on leaves "
                                      "(parameters)");
    nb_scope_end();
    nb_tensor *c = vec(3, (double[]){1, 2, 3});
    ck_assert_int_eq(nb_set_grad_contribution_hook(c, contrib_hook, &h), -1);
    ck_assert_str_eq(nb_last_error(), "nb_set_grad_contribution_hook: this tensor of shape (3) "
                                      "does not require grad, so backward never reaches it and "
                                      "its hook would never run (nb_set_requires_grad first)");
    ck_assert_int_eq(nb_set_grad_contribution_hook(c, NULL, NULL), 0);
    nb_free(c);
    nb_free(x);
    ck_assert_int_eq(nb_set_grad_contribution_hook(x, contrib_hook, &h), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "freed"));
    ck_assert_ptr_null(nb_grad_so_far(x));
}
END_TEST

/* ------------------------------------------ create_graph and nb_jvp: nothing lost */
static const nb_backward_opts CREATE = {.create_graph = true};

/* Under create_graph, the gradient a tensor gets is a sum; when one part has
 * a graph and another has none (c x contributes g c, which involves no
 * input), the sum must keep the graph, whichever arrives first:
 * f = sum(c x) + sum(x^3) has f' = c + 3x^2 and f'' = 6x. */
START_TEST(create_graph_sum_keeps_the_graph) {
    const double xs[3] = {0.5, -1.5, 2}, cs[3] = {3, -1, 0.25};
    for (int order = 0; order < 2; order++) {
        nb_scope_begin();
        nb_tensor *x = nb_set_requires_grad(vec(3, xs), true), *c = vec(3, cs), *g, *h;
        nb_tensor *lin = nb_sum_all(nb_mul(c, x)), *cube = nb_sum_all(nb_mul(nb_mul(x, x), x));
        nb_tensor *f = order ? nb_add(cube, lin) : nb_add(lin, cube);
        ck_assert_int_eq(nb_autograd_grad(&f, 1, NULL, &x, 1, &CREATE, &g), 0);
        double want_g[3], want_h[3];
        for (int i = 0; i < 3; i++) want_g[i] = cs[i] + 3 * xs[i] * xs[i], want_h[i] = 6 * xs[i];
        expect_values(g, 3, want_g, 1e-12);
        ck_assert_msg(nb_requires_grad(g), "order %d: the gradient lost its graph", order);
        nb_tensor *s = nb_sum_all(g);
        ck_assert_msg(nb_autograd_grad(&s, 1, NULL, &x, 1, NULL, &h) == 0, "order %d: %s", order,
                      nb_last_error());
        expect_values(h, 3, want_h, 1e-12);
        nb_scope_end();
    }
}
END_TEST

/* A leaf's .grad made with create_graph is a tensor a graph was recorded
 * from; a later plain backward must replace it, never add into it: what was
 * computed from it (p = .grad^2 here) still differentiates. */
START_TEST(create_graph_leaf_grad_is_replaced_not_written) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_F64, 0, NULL, 2.0), true);
    ck_assert_int_eq(nb_backward_with_opts(nb_mul(nb_mul(x, x), x), NULL, &CREATE), 0);
    nb_tensor *g = nb_grad(x); /* 3x^2 = 12, with a graph */
    nb_tensor *p = nb_mul(g, g); /* saves g: (3x^2)^2, p' = 36 x^3 = 288 */
    ck_assert_int_eq(nb_backward(nb_mul_scalar(x, 5.0)), 0);
    ck_assert_double_eq_tol(nb_item(nb_grad(x)), 17, 1e-12);
    ck_assert_msg(nb_backward(p) == 0, "%s", nb_last_error());
    ck_assert_double_eq_tol(nb_item(nb_grad(x)), 17 + 288, 1e-9);
    nb_scope_end();
}
END_TEST

/* y = a * b as a custom function with a tangent rule: ta b + a tb, where a
 * NULL tangent is zero. nb_jvp must run the rule when any input has a
 * tangent, the first or the last. */
static nb_tensor *mul2_fwd(nb_function_ctx *c, nb_tensor **in, int n, void *u) {
    (void)n, (void)u;
    return nb_function_save(c, in[0]) || nb_function_save(c, in[1]) ? NULL : nb_mul(in[0], in[1]);
}
static int mul2_bwd(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    gin[0] = nb_mul(g, nb_function_saved(c, 1));
    gin[1] = nb_mul(g, nb_function_saved(c, 0));
    return gin[0] && gin[1] ? 0 : -1;
}
static nb_tensor *mul2_jvp(nb_function_ctx *c, nb_tensor **t, int n, void *u) {
    (void)n, (void)u;
    nb_tensor *a = nb_function_saved(c, 0), *b = nb_function_saved(c, 1);
    if (!t[0]) return nb_mul(a, t[1]);
    if (!t[1]) return nb_mul(t[0], b);
    return nb_add(nb_mul(t[0], b), nb_mul(a, t[1]));
}
static const nb_function MUL2 = {.name = "mul2", .forward = mul2_fwd, .backward = mul2_bwd,
                                 .jvp = mul2_jvp};
static nb_tensor *mul2(nb_tensor **in, int n, void *ctx) {
    (void)ctx;
    return nb_function_apply(&MUL2, in, n, NULL);
}

START_TEST(jvp_runs_a_rule_whichever_input_has_a_tangent) {
    nb_scope_begin();
    const double av[2] = {1, 2}, bv[2] = {3, -4}, tv[2] = {0.5, -2};
    nb_tensor *in[2] = {vec(2, av), vec(2, bv)}, *t = vec(2, tv), *y, *ty;
    nb_tensor *first[2] = {t, NULL}, *last[2] = {NULL, t}, *both[2] = {t, t};
    ck_assert_msg(nb_jvp(mul2, NULL, 2, in, first, &y, &ty) == 0, "%s", nb_last_error());
    expect_values(ty, 2, (double[]){0.5 * 3, -2 * -4}, 1e-15); /* t b */
    ck_assert_msg(nb_jvp(mul2, NULL, 2, in, last, &y, &ty) == 0, "%s", nb_last_error());
    expect_values(ty, 2, (double[]){1 * 0.5, 2 * -2}, 1e-15); /* a t */
    ck_assert_msg(nb_jvp(mul2, NULL, 2, in, both, &y, &ty) == 0, "%s", nb_last_error());
    expect_values(ty, 2, (double[]){0.5 * 4, -2 * -2}, 1e-15); /* t (a + b) */
    nb_scope_end();
}
END_TEST

/* A custom backward that reads a tensor its forward made and saved (neither
 * an input nor the output: it has no history) cannot give a gradient that
 * differentiates again; the second derivative is refused, naming it. */
static nb_tensor *sq_saving_2x_fwd(nb_function_ctx *c, nb_tensor **in, int n, void *u) {
    (void)n, (void)u;
    nb_tensor *two_x = nb_mul_scalar(in[0], 2.0); /* made here */
    return nb_function_save(c, two_x) ? NULL : nb_mul(in[0], in[0]);
}
static int sq_saving_2x_bwd(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    return (gin[0] = nb_mul(g, nb_function_saved(c, 0))) ? 0 : -1;
}
static const nb_function SQ_SAVING_2X = {.name = "sq_saving_2x", .forward = sq_saving_2x_fwd,
                                         .backward = sq_saving_2x_bwd};

START_TEST(saved_forward_temporary_is_once_differentiable) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(vec(2, (double[]){1.5, -2}), true), *g, *h;
    nb_tensor *y = nb_sum_all(nb_function_apply(&SQ_SAVING_2X, &x, 1, NULL));
    ck_assert_int_eq(nb_autograd_grad(&y, 1, NULL, &x, 1, &CREATE, &g), 0);
    expect_values(g, 2, (double[]){3, -4}, 1e-15);
    nb_tensor *s = nb_sum_all(g);
    expect_error_rc(nb_autograd_grad(&s, 1, NULL, &x, 1, NULL, &h),
                    "the gradient made by the backward of sq_saving_2x cannot be differentiated "
                    "again");
    nb_scope_end();
}
END_TEST

/* x^3 whose backward has a recorded form (create_graph: grad mode is on)
 * that is wrong but self-consistent: 2x^2 g where the plain form gives
 * 3x^2 g. gradgradcheck differentiates the recorded gradient (4x v, the
 * same analytically and numerically), so only comparing it with the plain
 * gradient finds the error. */
static double cube_k_recorded = 3;
static nb_tensor *cube_k_fwd(nb_function_ctx *c, nb_tensor **in, int n, void *u) {
    (void)n, (void)u;
    return nb_function_save(c, in[0]) ? NULL : nb_mul(nb_mul(in[0], in[0]), in[0]);
}
static int cube_k_bwd(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    nb_tensor *x = nb_function_saved(c, 0);
    double k = nb_grad_enabled() ? cube_k_recorded : 3;
    return (gin[0] = nb_mul(nb_mul_scalar(nb_mul(x, x), k), g)) ? 0 : -1;
}
static const nb_function CUBE_K = {.name = "cube_k", .forward = cube_k_fwd,
                                   .backward = cube_k_bwd};
static nb_tensor *cube_k(nb_tensor **in, int n, void *ctx) {
    (void)ctx;
    return nb_function_apply(&CUBE_K, in, n, NULL);
}

START_TEST(gradgradcheck_compares_the_recorded_gradient_with_the_plain_one) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(vec(3, (double[]){0.5, -1.25, 2}), true);
    cube_k_recorded = 3;
    expect_gradgradcheck("cube_k (custom), both forms right", cube_k, NULL, 1, &x);
    cube_k_recorded = 2;
    expect_gradcheck("cube_k (custom), plain form right", cube_k, NULL, 1, &x);
    nb_gradcheck_result r;
    ck_assert(!nb_gradgradcheck(cube_k, NULL, 1, &x, NULL, &r));
    ck_assert(!r.ok);
    ck_assert_ptr_nonnull(strstr(r.message, "nb_gradgradcheck: second-order: the gradient made "
                                            "with create_graph differs from the plain "
                                            "backward's for input 0 at (0) (flat 0)"));
    ck_assert_str_eq(r.message, nb_last_error());
    nb_clear_error();
    cube_k_recorded = 3;
    nb_scope_end();
}
END_TEST

Suite *suite_autograd(void) {
    Suite *s = suite_create("autograd");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120); /* a hang guard (tests/run_tests.c) */
    tcase_add_test(tc, accumulates_across_backward_calls);
    tcase_add_test(tc, shared_subexpression);
    tcase_add_test(tc, broadcast_gradients_sum_back);
    tcase_add_test(tc, accumulates_gradients_given_as_views);
    tcase_add_test(tc, gradient_through_views_reaches_leaf);
    tcase_add_test(tc, backward_with_grad_for_non_scalar);
    tcase_add_test(tc, grad_mode_off_records_nothing);
    tcase_add_test(tc, detach_shares_storage_and_stops_gradient);
    tcase_add_test(tc, in_place_change_of_saved_input_is_caught);
    tcase_add_test(tc, mark_modified_invalidates_saved_tensors);
    tcase_add_test(tc, write_version_counts_writes);
    tcase_add_test(tc, requires_grad_rules);
    tcase_add_test(tc, graph_keeps_freed_intermediates_alive);
    tcase_add_test(tc, deep_chain_does_not_overflow_the_stack);
    tcase_add_test(tc, f32_gradients_are_f32);
    tcase_add_test(tc, sparse_gradient_added_in_place_keeps_the_bits);
    tcase_add_test(tc, caller_gradient_is_never_taken_over);
    tcase_add_test(tc, grad_hook_runs_once_when_the_gradient_is_complete);
    tcase_add_test(tc, grad_hook_errors);
    tcase_add_test(tc, contribution_hook_sees_each_part_of_a_tied_weight);
    tcase_add_test(tc, contribution_hook_errors);
    tcase_add_test(tc, anomaly_names_the_forward_op);
    tcase_add_test(tc, anomaly_names_the_backward_op);
    tcase_add_test(tc, anomaly_mode_is_quiet_on_a_transformer_step);
    suite_add_tcase(s, tc);
    TCase *gc = tcase_create("gradcheck");
    tcase_add_test(gc, gradcheck_reports_the_worst_element);
    tcase_add_test(gc, gradcheck_passes_and_restores_state);
    tcase_add_test(gc, gradcheck_rejects_bad_inputs);
    suite_add_tcase(s, gc);
    TCase *hc = tcase_create("higher_order");
    tcase_set_timeout(hc, 60);
    tcase_add_test(hc, create_graph_sum_keeps_the_graph);
    tcase_add_test(hc, create_graph_leaf_grad_is_replaced_not_written);
    tcase_add_test(hc, jvp_runs_a_rule_whichever_input_has_a_tangent);
    tcase_add_test(hc, saved_forward_temporary_is_once_differentiable);
    tcase_add_test(hc, gradgradcheck_compares_the_recorded_gradient_with_the_plain_one);
    suite_add_tcase(s, hc);
    return s;
}
