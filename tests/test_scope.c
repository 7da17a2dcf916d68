/* test_scope.c: the memory model. Tensors belong to the scope open when they
 * were made; nb_keep hands one outward; views and graphs keep storage alive. */
#include <math.h>

#include "test_util.h"

START_TEST(a_million_tensors_come_and_go) {
    int64_t base = nb_live_tensors();
    nb_tensor *w = nb_set_requires_grad(nb_ones(NB_F32, NB_SHAPE(4)), true);
    for (int step = 0; step < 1000; step++) {
        nb_scope_begin();
        nb_tensor *y = w;
        for (int k = 0; k < 999; k++) y = nb_mul_scalar(y, 1.0);
        /* w, 999 intermediates, and w's .grad from the second step on */
        ck_assert_int_eq(nb_live_tensors(), base + 1000 + (step > 0));
        ck_assert_int_eq(nb_backward(nb_sum_all(y)), 0);
        nb_scope_end();
        ck_assert_int_eq(nb_live_tensors(), base + 2); /* w and its .grad */
    }
    nb_scope_begin();
    ck_assert_double_eq_tol(nb_item(nb_select(nb_grad(w), 0, 0)), 1000.0, 1e-3);
    nb_scope_end();
    nb_free(w);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(nested_scopes_free_only_their_own) {
    int64_t base = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *outer = nb_ones(NB_F64, NB_SHAPE(3));
    ck_assert_int_eq(nb_scope_depth(), 1);
    nb_scope_begin();
    nb_tensor *inner = nb_add(outer, outer);
    ck_assert_ptr_nonnull(inner);
    ck_assert_int_eq(nb_live_tensors(), base + 2);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), base + 1);
    ck_assert_double_eq(nb_item(nb_sum_all(outer)), 3.0);
    nb_scope_end();
    ck_assert_int_eq(nb_scope_depth(), 0);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(keep_hands_a_detached_value_outward) {
    int64_t base = nb_live_tensors();
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_F64, NB_SHAPE(2), 2.0), true);
    nb_scope_begin();
    nb_tensor *kept;
    nb_scope_begin();
    nb_tensor *y = nb_mul(x, x);
    kept = nb_keep(y);
    ck_assert(nb_requires_grad(y));
    ck_assert(!nb_requires_grad(kept));
    ck_assert_ptr_eq(nb_data(kept), nb_data(y));
    nb_scope_end();
    /* y is gone, its storage lives on in kept */
    ck_assert_double_eq(nb_item(nb_sum_all(kept)), 8.0);
    nb_scope_end();
    nb_free(x);
    ck_assert_int_eq(nb_live_tensors(), base);
    /* at depth 1, nb_keep makes a persistent tensor */
    nb_scope_begin();
    nb_tensor *p = nb_keep(nb_ones(NB_F32, NB_SHAPE(2)));
    nb_scope_end();
    nb_tensor *sum = nb_sum_all(p);
    ck_assert_double_eq(nb_item(sum), 2.0);
    ck_assert_int_eq(nb_live_tensors(), base + 2); /* p and its sum, both persistent */
    nb_free(sum);
    nb_free(p);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(free_inside_a_scope_is_not_freed_twice) {
    int64_t base = nb_live_tensors();
    nb_scope_begin();
    nb_tensor *a = nb_zeros(NB_F32, NB_SHAPE(8));
    nb_tensor *b = nb_zeros(NB_F32, NB_SHAPE(8));
    nb_free(a);
    ck_assert_int_eq(nb_live_tensors(), base + 1);
    (void)b;
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

START_TEST(views_outlive_their_base) {
    nb_tensor *base = nb_from_data(NB_F64, NB_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    nb_tensor *t = nb_transpose(base, 0, 1);
    nb_free(base);
    double v[4];
    nb_copy_to_f64(t, v);
    ck_assert_double_eq(v[1], 3.0);
    ck_assert_double_eq(v[2], 2.0);
    nb_free(t);
}
END_TEST

START_TEST(scope_end_without_begin_is_an_error) {
    nb_scope_end();
    ck_assert_ptr_nonnull(nb_last_error());
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_scope_end: no scope is open"));
    nb_clear_error();
}
END_TEST

/* The training loop of docs/concepts.md ("Scopes free memory for you"):
 * memory stays flat step after step. */
START_TEST(training_loop_holds_flat_memory) {
    int64_t base = nb_live_tensors();
    nb_rng r;
    nb_rng_seed(&r, 3);
    nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(4, 1), &r), true);
    nb_tensor *x = nb_randn(NB_F64, NB_SHAPE(16, 4), &r);
    nb_tensor *true_w = nb_from_data(NB_F64, NB_SHAPE(4, 1), (double[]){1, -2, 3, 0.5});
    nb_tensor *y = nb_matmul(x, true_w);
    nb_free(true_w);
    double first = 0, last = 0;
    int64_t live_after_first = 0;
    for (int step = 0; step < 300; step++) {
        nb_scope_begin();
        nb_tensor *err = nb_sub(nb_matmul(x, w), y);
        nb_tensor *loss = nb_mean_all(nb_mul(err, err));
        ck_assert_int_eq(nb_backward(loss), 0);
        if (step == 0) first = nb_item(loss);
        last = nb_item(loss);
        nb_set_grad_enabled(false);
        nb_copy_into(w, nb_sub(w, nb_mul_scalar(nb_grad(w), 0.1)));
        nb_set_grad_enabled(true);
        nb_zero_grad(w);
        nb_scope_end();
        if (step == 0) live_after_first = nb_live_tensors();
        ck_assert_int_eq(nb_live_tensors(), live_after_first);
    }
    ck_assert_msg(last < first * 1e-6, "loss %g -> %g", first, last);
    nb_free(w);
    nb_free(x);
    nb_free(y);
    ck_assert_int_eq(nb_live_tensors(), base);
}
END_TEST

/* An intermediate that no backward rule reads gives up its storage when it is
 * freed, though the graph still runs through it; one that a rule saved keeps
 * it. Both graphs still give the right gradient. */
START_TEST(freed_intermediates_keep_only_saved_data) {
    const int64_t n = 1 << 18; /* 1 MiB of f32 */
    const int64_t bytes = n * (int64_t)sizeof(float);
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_full(NB_F32, NB_SHAPE(n), 0.5), true);
    /* s = 2x is read by no backward rule (mul_scalar's needs only g) */
    nb_tensor *s = nb_mul_scalar(x, 2.0);
    nb_tensor *e = nb_exp(s); /* exp saves its output, not s */
    int64_t before = nb_memory_allocated();
    nb_free(s);
    ck_assert_int_eq(before - nb_memory_allocated(), bytes);
    /* a = exp(x) is saved by mul(a, a): freeing it keeps its data */
    nb_tensor *a = nb_exp(x);
    nb_tensor *sq = nb_mul(a, a);
    before = nb_memory_allocated();
    nb_free(a);
    ck_assert_int_eq(before - nb_memory_allocated(), 0);
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_add(e, sq))), 0);
    /* d/dx [exp(2x) + exp(x)^2] = 4 exp(2x) at every element */
    double want = 4.0 * exp(1.0), got[2];
    nb_tensor *g = nb_grad(x);
    got[0] = nb_item(nb_select(g, 0, 0));
    got[1] = nb_item(nb_select(g, 0, n - 1));
    for (int i = 0; i < 2; i++) ck_assert_double_eq_tol(got[i], want, 1e-5 * want);
    nb_scope_end();
}
END_TEST

Suite *suite_scope(void) {
    Suite *s = suite_create("scope");
    TCase *tc = tcase_create("scopes");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, a_million_tensors_come_and_go);
    tcase_add_test(tc, nested_scopes_free_only_their_own);
    tcase_add_test(tc, keep_hands_a_detached_value_outward);
    tcase_add_test(tc, free_inside_a_scope_is_not_freed_twice);
    tcase_add_test(tc, views_outlive_their_base);
    tcase_add_test(tc, scope_end_without_begin_is_an_error);
    tcase_add_test(tc, training_loop_holds_flat_memory);
    tcase_add_test(tc, freed_intermediates_keep_only_saved_data);
    suite_add_tcase(s, tc);
    return s;
}
