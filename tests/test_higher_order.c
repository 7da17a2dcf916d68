/* test_higher_order.c: what the engine gives beyond first derivatives, on
 * values worked out by hand: create_graph (a leaf's .grad with a graph,
 * replaced by later backwards), nb_autograd_grad (which gradients it
 * returns, and that it touches no .grad), Hessians and Hessian-vector
 * products, nb_jvp, nb_gradgradcheck and check_forward_ad catching wrong
 * rules (and saying which order failed), custom functions differentiated
 * twice, once-differentiable refusals, and the messages that point a user
 * the right way. Every op's own second-order and forward-mode rules are
 * checked by test_registry.c. */
#include "test_util.h"

static const nb_backward_opts CREATE = {.create_graph = true};

static nb_tensor *scalar_leaf(double v) {
    return nb_set_requires_grad(nb_full(NB_F64, 0, NULL, v), true);
}

/* Rosenbrock's function (1 - x)^2 + 100 (y - x^2)^2 */
static nb_tensor *rosenbrock(nb_tensor *x, nb_tensor *y) {
    nb_tensor *a = nb_add_scalar(nb_neg(x), 1.0);
    nb_tensor *b = nb_sub(y, nb_mul(x, x));
    return nb_add(nb_mul(a, a), nb_mul_scalar(nb_mul(b, b), 100.0));
}

START_TEST(hessian_of_rosenbrock) {
    const double pts[][2] = {{-1.2, 1.0}, {0.5, -0.25}, {1.0, 1.0}};
    for (int p = 0; p < 3; p++) {
        nb_scope_begin();
        double X = pts[p][0], Y = pts[p][1];
        nb_tensor *x = scalar_leaf(X), *y = scalar_leaf(Y), *in[2] = {x, y}, *g[2], *h[2];
        nb_tensor *f = rosenbrock(x, y);
        ck_assert_int_eq(nb_autograd_grad(&f, 1, NULL, in, 2, &CREATE, g), 0);
        ck_assert_double_eq_tol(nb_item(g[0]), -2 * (1 - X) - 400 * X * (Y - X * X), 1e-9);
        ck_assert_double_eq_tol(nb_item(g[1]), 200 * (Y - X * X), 1e-9);
        const double want[2][2] = {{2 - 400 * (Y - X * X) + 800 * X * X, -400 * X},
                                   {-400 * X, 200}};
        for (int r = 0; r < 2; r++) {
            ck_assert_msg(nb_requires_grad(g[r]), "gradient %d has no graph", r);
            /* the rows share the graph: keep it for the second */
            nb_backward_opts keep = {.retain_graph = r == 0};
            ck_assert_msg(nb_autograd_grad(&g[r], 1, NULL, in, 2, &keep, h) == 0, "%s",
                          nb_last_error());
            for (int c = 0; c < 2; c++)
                ck_assert_msg(fabs(nb_item(h[c]) - want[r][c]) <= 1e-9 * (1 + fabs(want[r][c])),
                              "H[%d][%d] at (%g, %g): %.17g, want %.17g", r, c, X, Y,
                              nb_item(h[c]), want[r][c]);
        }
        ck_assert_ptr_null(nb_grad(x)); /* nb_autograd_grad touches no .grad */
        ck_assert_ptr_null(nb_grad(y));
        nb_scope_end();
    }
}
END_TEST

/* Hv by the double-backward trick: d/dx (g(x) . v) for f = sum(x^3): H = diag(6x). */
START_TEST(hessian_vector_product) {
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), (double[]){1, -2, 0.5}),
                                        true);
    nb_tensor *v = nb_from_data(NB_F64, NB_SHAPE(3), (double[]){0.25, 1, -3});
    nb_tensor *f = nb_sum_all(nb_mul(nb_mul(x, x), x)), *g, *hv;
    ck_assert_int_eq(nb_autograd_grad(&f, 1, NULL, &x, 1, &CREATE, &g), 0);
    nb_tensor *gv = nb_sum_all(nb_mul(g, v));
    ck_assert_int_eq(nb_autograd_grad(&gv, 1, NULL, &x, 1, NULL, &hv), 0);
    const double want[3] = {6 * 1 * 0.25, 6 * -2 * 1, 6 * 0.5 * -3};
    for (int i = 0; i < 3; i++)
        ck_assert_double_eq_tol(nb_item(nb_select(hv, 0, i)), want[i], 1e-12);
    nb_scope_end();
}
END_TEST

START_TEST(autograd_grad_returns_what_was_asked) {
    nb_scope_begin();
    nb_tensor *a = scalar_leaf(3), *b = scalar_leaf(5), *unused = scalar_leaf(7);
    nb_tensor *m = nb_mul(a, b);                 /* a non-leaf input */
    nb_tensor *y1 = nb_mul(m, a), *y2 = nb_add(m, b); /* y1 = a^2 b, y2 = ab + b */
    nb_tensor *outs[2] = {y1, y2}, *gos[2] = {nb_full(NB_F64, 0, NULL, 2.0), NULL};
    nb_tensor *ins[4] = {a, b, m, unused}, *g[4];
    ck_assert_int_eq(nb_autograd_grad(outs, 2, gos, ins, 4, &(nb_backward_opts){.retain_graph = true},
                                      g), 0);
    /* 2 dy1 + dy2: d/da = 2 (2ab) + b = 65; d/db = 2 a^2 + a + 1 = 22; d/dm = 2a + 1 = 7 */
    ck_assert_double_eq_tol(nb_item(g[0]), 65, 1e-12);
    ck_assert_double_eq_tol(nb_item(g[1]), 22, 1e-12);
    ck_assert_double_eq_tol(nb_item(g[2]), 7, 1e-12);
    ck_assert_ptr_null(g[3]); /* reaches no output */
    ck_assert(!nb_requires_grad(g[0]));
    ck_assert_ptr_null(nb_grad(a));
    /* plain gradients are detached: differentiating one says how to get one that is not */
    nb_tensor *again[1];
    ck_assert_int_eq(nb_autograd_grad(&g[0], 1, NULL, &a, 1, NULL, again), -1);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "made without create_graph"));
    nb_clear_error();
    /* errors name the argument */
    /* the gradient of an output with respect to itself */
    ck_assert_msg(nb_autograd_grad(&y2, 1, NULL, &y2, 1, NULL, again) == 0, "%s", nb_last_error());
    ck_assert_double_eq_tol(nb_item(again[0]), 1, 1e-15);
    nb_tensor *c = nb_full(NB_F64, 0, NULL, 1.0);
    expect_error_rc(nb_autograd_grad(outs, 1, NULL, &c, 1, NULL, again),
                    "nb_autograd_grad: input 0 (shape ()) does not require grad");
    nb_tensor *vec = nb_mul_scalar(nb_set_requires_grad(nb_ones(NB_F64, NB_SHAPE(2)), true), 2);
    expect_error_rc(nb_autograd_grad(&vec, 1, NULL, &a, 1, NULL, again),
                    "nb_autograd_grad: output 0 must have one element");
    nb_scope_end();
}
END_TEST

/* nb_backward with create_graph: .grad has a graph; a second backward through it
 * gives the second derivative, and a later backward replaces .grad (never writes
 * into the tensor a graph was recorded from). */
START_TEST(backward_create_graph_leaf_grad) {
    nb_scope_begin();
    nb_tensor *x = scalar_leaf(2);
    nb_tensor *y = nb_mul(nb_mul(x, x), x); /* x^3: 3x^2 = 12, 6x = 12 */
    ck_assert_int_eq(nb_backward_with_opts(y, NULL, &CREATE), 0);
    nb_tensor *g = nb_grad(x);
    ck_assert_double_eq_tol(nb_item(g), 12, 1e-12);
    ck_assert(nb_requires_grad(g));
    nb_tensor *g_kept = nb_mul_scalar(g, 1.0); /* recorded from this .grad */
    nb_clear_grad(x);
    ck_assert_int_eq(nb_backward(g_kept), 0);
    ck_assert_double_eq_tol(nb_item(nb_grad(x)), 12, 1e-12); /* d(3x^2)/dx */
    /* the plain message for a detached gradient */
    nb_tensor *z = scalar_leaf(1);
    ck_assert_int_eq(nb_backward(nb_mul(z, z)), 0);
    expect_error_rc(nb_backward(nb_grad(z)),
                    "nb_backward: the tensor is a gradient made by a backward without "
                       "create_graph");
    nb_scope_end();
}
END_TEST

/* ---------------------------------------------------------- custom functions */
/* cube(x) = x^3 with a backward of nabla ops on the saved input: differentiable twice */
static nb_tensor *cube_fwd(nb_function_ctx *c, nb_tensor **in, int n, void *u) {
    (void)n, (void)u;
    return nb_function_save(c, in[0]) ? NULL : nb_mul(nb_mul(in[0], in[0]), in[0]);
}
static int cube_bwd(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    nb_tensor *x = nb_function_saved(c, 0);
    gin[0] = nb_mul(nb_mul_scalar(nb_mul(x, x), 3.0), g);
    return gin[0] ? 0 : -1;
}
/* the same with a term that drops out of the second derivative (x detached) */
static int cube_bwd_detached(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    nb_tensor *x = nb_function_saved(c, 0);
    gin[0] = nb_mul(nb_mul_scalar(nb_mul(x, nb_detach(x)), 3.0), g);
    return gin[0] ? 0 : -1;
}
/* and on raw values */
static int cube_bwd_raw(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    nb_tensor *x = nb_function_saved(c, 0);
    int64_t n = nb_numel(x);
    gin[0] = nb_zeros(NB_F64, nb_ndim(x), nb_shape(x));
    double *o = nb_data(gin[0]), *xv = nb_data(nb_contiguous(x)), *gv = nb_data(nb_contiguous(g));
    for (int64_t i = 0; i < n; i++) o[i] = 3 * xv[i] * xv[i] * gv[i];
    return 0;
}
static nb_tensor *cube_jvp(nb_function_ctx *c, nb_tensor **t, int n, void *u) {
    (void)n, (void)u;
    nb_tensor *x = nb_function_saved(c, 0);
    return nb_mul(nb_mul_scalar(nb_mul(x, x), 3.0), t[0]);
}
static nb_tensor *cube_jvp_wrong(nb_function_ctx *c, nb_tensor **t, int n, void *u) {
    (void)n, (void)u;
    return nb_mul(nb_mul_scalar(nb_function_saved(c, 0), 3.0), t[0]); /* 3x t, not 3x^2 t */
}

static const nb_function cube = {.name = "cube", .forward = cube_fwd, .backward = cube_bwd,
                                 .jvp = cube_jvp};
static const nb_function cube_detached = {.name = "cube_detached", .forward = cube_fwd,
                                          .backward = cube_bwd_detached};
static const nb_function cube_raw = {.name = "cube_raw", .forward = cube_fwd,
                                     .backward = cube_bwd_raw};
static const nb_function cube_bad_jvp = {.name = "cube_bad_jvp", .forward = cube_fwd,
                                         .backward = cube_bwd, .jvp = cube_jvp_wrong};

static nb_tensor *apply_fn(nb_tensor **in, int n, void *ctx) {
    return nb_function_apply(ctx, in, n, NULL);
}

static nb_tensor *vec_leaf(void) {
    return nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(3), (double[]){0.7, -1.3, 2.1}),
                                true);
}

START_TEST(custom_function_twice_differentiable) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf();
    expect_gradgradcheck("custom cube", apply_fn, (void *)&cube, 1, &x);
    expect_forward_ad("custom cube", apply_fn, (void *)&cube, 1, &x);
    nb_scope_end();
}
END_TEST

START_TEST(gradgradcheck_says_second_order_failed) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf();
    nb_gradcheck_result r;
    ck_assert(nb_gradcheck(apply_fn, (void *)&cube_detached, 1, &x, NULL, &r)); /* first order fine */
    ck_assert(!nb_gradgradcheck(apply_fn, (void *)&cube_detached, 1, &x, NULL, &r));
    ck_assert_msg(strstr(r.message, "nb_gradgradcheck: second-order: MISMATCH"), "%s", r.message);
    ck_assert_msg(strstr(r.message, "; custom functions in the graph checked: cube_detached"), "%s",
                  r.message);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* A function that draws anew at each call cannot be checked by finite
 * differences: the checks say that, not that a rule is wrong. */
static nb_tensor *dropout_fn(nb_tensor **in, int n, void *ctx) {
    (void)n;
    return nb_dropout(nb_mul(in[0], in[0]), 0.5, true, ctx);
}

START_TEST(gradcheck_of_a_random_function_says_so) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf();
    nb_rng rng;
    nb_rng_seed(&rng, 7);
    nb_gradcheck_opts fast = NB_GRADCHECK_DEFAULTS;
    fast.fast_mode = true;
    const char *why = "the function gave different values at the same point (output element ";
    const char *how = "): it is not deterministic (dropout in training mode, or a generator that "
                      "goes on between calls), and finite differences cannot check it; evaluate "
                      "it in eval mode, or reseed its generator (nb_rng_seed) at the start of "
                      "each call";
    nb_gradcheck_result r;
    for (int k = 0; k < 4; k++) {
        void *g = k % 2 ? NULL : &rng; /* its own generator, or the global one */
        ck_assert(!nb_gradcheck(dropout_fn, g, 1, &x, k < 2 ? NULL : &fast, &r));
        ck_assert_msg(strstr(r.message, "nb_gradcheck: ") == r.message && strstr(r.message, why) &&
                      strstr(r.message, how), "%s", r.message);
        nb_clear_error();
    }
    ck_assert(!nb_gradgradcheck(dropout_fn, &rng, 1, &x, NULL, &r));
    ck_assert_msg(strstr(r.message, "nb_gradgradcheck: ") == r.message && strstr(r.message, why),
                  "%s", r.message);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(forward_ad_check_says_forward_mode_failed) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf();
    nb_gradcheck_result r;
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    ck_assert(nb_gradcheck(apply_fn, (void *)&cube_bad_jvp, 1, &x, &o, &r));
    o.check_forward_ad = true;
    ck_assert(!nb_gradcheck(apply_fn, (void *)&cube_bad_jvp, 1, &x, &o, &r));
    ck_assert_msg(strstr(r.message, "nb_gradcheck: forward-mode: MISMATCH"), "%s", r.message);
    ck_assert_msg(strstr(r.message, "; custom functions in the graph checked: cube_bad_jvp"), "%s",
                  r.message);
    o.fast_mode = true;
    ck_assert(!nb_gradcheck(apply_fn, (void *)&cube_bad_jvp, 1, &x, &o, &r));
    ck_assert_msg(strstr(r.message, "forward-mode: MISMATCH"), "%s", r.message);
    nb_clear_error();
    /* no rule at all: the message names the function */
    nb_tensor *t = nb_ones(NB_F64, NB_SHAPE(3)), *y, *ty;
    expect_error_rc(nb_jvp(apply_fn, (void *)&cube_raw, 1, &x, &t, &y, &ty),
                    "nb_jvp: cube_raw has no forward-mode (tangent) rule");
    nb_scope_end();
}
END_TEST

/* A backward on raw values gives right first derivatives under create_graph,
 * and refuses the second, naming the function. */
START_TEST(once_differentiable_is_refused_by_name) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf(), *g;
    nb_tensor *y = nb_sum_all(nb_function_apply(&cube_raw, &x, 1, NULL));
    ck_assert_int_eq(nb_autograd_grad(&y, 1, NULL, &x, 1, &CREATE, &g), 0);
    const double xs[3] = {0.7, -1.3, 2.1};
    for (int i = 0; i < 3; i++)
        ck_assert_double_eq_tol(nb_item(nb_select(g, 0, i)), 3 * xs[i] * xs[i], 1e-12);
    nb_tensor *h;
    nb_tensor *s = nb_sum_all(g);
    expect_error_rc(nb_autograd_grad(&s, 1, NULL, &x, 1, NULL, &h),
                    "the gradient made by the backward of cube_raw cannot be differentiated "
                       "again", "once_differentiable");
    nb_scope_end();
}
END_TEST

/* exp with its output saved: the second derivative reads the saved output
 * with its history, even after the caller freed the output's handle */
static nb_tensor *myexp_fwd(nb_function_ctx *c, nb_tensor **in, int n, void *u) {
    (void)n, (void)u;
    nb_tensor *y = nb_exp(in[0]);
    return nb_function_save(c, y) ? NULL : y;
}
static int myexp_bwd(nb_function_ctx *c, nb_tensor *g, nb_tensor **gin, void *u) {
    (void)u;
    gin[0] = nb_mul(g, nb_function_saved(c, 0));
    return gin[0] ? 0 : -1;
}
static const nb_function myexp = {.name = "myexp", .forward = myexp_fwd, .backward = myexp_bwd};

START_TEST(saved_output_with_history) {
    nb_scope_begin();
    nb_tensor *x = vec_leaf(), *g, *h;
    nb_tensor *y = nb_function_apply(&myexp, &x, 1, NULL);
    nb_tensor *s = nb_sum_all(nb_mul(y, y)); /* d/dx = 2 e^2x, d2 = 4 e^2x */
    nb_free(y);
    ck_assert_int_eq(nb_autograd_grad(&s, 1, NULL, &x, 1, &CREATE, &g), 0);
    nb_tensor *sg = nb_sum_all(g);
    ck_assert_int_eq(nb_autograd_grad(&sg, 1, NULL, &x, 1, NULL, &h), 0);
    const double xs[3] = {0.7, -1.3, 2.1};
    for (int i = 0; i < 3; i++) {
        ck_assert_double_eq_tol(nb_item(nb_select(g, 0, i)), 2 * exp(2 * xs[i]), 1e-12 * exp(4.2));
        ck_assert_double_eq_tol(nb_item(nb_select(h, 0, i)), 4 * exp(2 * xs[i]), 1e-12 * exp(4.2));
    }
    nb_scope_end();
}
END_TEST

/* nb_jvp: J t for y = x * w + x (w a constant input: no tangent) */
static nb_tensor *affine(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_add(nb_mul(in[0], in[1]), in[0]);
}

START_TEST(jvp_values) {
    nb_scope_begin();
    nb_tensor *x = nb_from_data(NB_F64, NB_SHAPE(2), (double[]){1, 2});
    nb_tensor *w = nb_from_data(NB_F64, NB_SHAPE(2), (double[]){3, -4});
    nb_tensor *in[2] = {x, w}, *tan[2] = {nb_from_data(NB_F64, NB_SHAPE(2), (double[]){1, 0.5}), NULL};
    nb_tensor *y, *ty;
    ck_assert_int_eq(nb_jvp(affine, NULL, 2, in, tan, &y, &ty), 0);
    ck_assert_double_eq_tol(nb_item(nb_select(y, 0, 1)), -6, 1e-15);
    ck_assert_double_eq_tol(nb_item(nb_select(ty, 0, 0)), 4, 1e-15);  /* (w + 1) t */
    ck_assert_double_eq_tol(nb_item(nb_select(ty, 0, 1)), -1.5, 1e-15);
    ck_assert(!nb_requires_grad(y) && !nb_requires_grad(ty));
    nb_scope_end();
}
END_TEST

/* nb_gradcheck with respect to x leaves the .grad of other leaves (a module's
 * weights) as it found them. */
static nb_tensor *scaled(nb_tensor **in, int n, void *ctx) {
    (void)n;
    return nb_mul(in[0], ctx);
}

START_TEST(gradcheck_leaves_other_leaves_alone) {
    nb_scope_begin();
    nb_tensor *w = vec_leaf(), *x = vec_leaf();
    ck_assert_int_eq(nb_backward(nb_sum_all(nb_mul(w, w))), 0);
    nb_tensor *before = nb_grad(w);
    double b0 = nb_item(nb_select(before, 0, 0));
    expect_gradcheck("x * w wrt x", scaled, w, 1, &x);
    ck_assert_ptr_eq(nb_grad(w), before);
    ck_assert_double_eq(nb_item(nb_select(nb_grad(w), 0, 0)), b0);
    nb_scope_end();
}
END_TEST

/* Forward over reverse: check_forward_ad on nb_gradgradcheck's function
 * pushes tangents through a create_graph backward. And empty inputs. */
static nb_tensor *tanh_prod(nb_tensor **in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_tanh(nb_mul(in[0], in[1]));
}

/* gather with repeated indices: its backward is a scatter that adds, and
 * forward over reverse pushes tangents through that scatter */
static nb_tensor *gather_rep(nb_tensor **in, int n, void *idx) {
    (void)n;
    return nb_mul(nb_gather(in[0], 1, idx), nb_gather(in[0], 1, idx));
}

START_TEST(forward_over_reverse_and_empty) {
    {
        nb_tensor *x = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(2, 3),
                                                         (double[]){0.3, -1.1, 0.8, 1.7, -0.4, 0.9}),
                                            true);
        nb_tensor *idx = nb_from_data(NB_I64, NB_SHAPE(2, 4), (int64_t[]){0, 0, 2, 0, 1, 1, 1, 2});
        nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
        o.check_forward_ad = true;
        nb_gradcheck_result r;
        ck_assert_msg(nb_gradgradcheck(gather_rep, idx, 1, &x, &o, &r), "%s", r.message);
        nb_free(x);
        nb_free(idx);
    }
    nb_scope_begin();
    nb_tensor *in[2] = {vec_leaf(), vec_leaf()};
    nb_gradcheck_opts o = NB_GRADCHECK_DEFAULTS;
    o.check_forward_ad = true;
    nb_gradcheck_result r;
    ck_assert_msg(nb_gradgradcheck(tanh_prod, NULL, 2, in, &o, &r), "%s", r.message);
    nb_tensor *e = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(0, 3)), true);
    ck_assert_msg(nb_gradcheck(apply_fn, (void *)&cube, 1, &e, &o, &r), "%s", r.message);
    ck_assert_int_eq(r.checked, 0);
    ck_assert_msg(nb_gradgradcheck(apply_fn, (void *)&cube, 1, &e, &o, &r), "%s", r.message);
    nb_scope_end();
}
END_TEST

Suite *suite_higher_order(void) {
    Suite *s = suite_create("higher_order");
    TCase *tc = tcase_create("higher_order");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hessian_of_rosenbrock);
    tcase_add_test(tc, hessian_vector_product);
    tcase_add_test(tc, autograd_grad_returns_what_was_asked);
    tcase_add_test(tc, backward_create_graph_leaf_grad);
    tcase_add_test(tc, custom_function_twice_differentiable);
    tcase_add_test(tc, gradgradcheck_says_second_order_failed);
    tcase_add_test(tc, forward_ad_check_says_forward_mode_failed);
    tcase_add_test(tc, once_differentiable_is_refused_by_name);
    tcase_add_test(tc, jvp_values);
    tcase_add_test(tc, gradcheck_leaves_other_leaves_alone);
    tcase_add_test(tc, gradcheck_of_a_random_function_says_so);
    tcase_add_test(tc, forward_over_reverse_and_empty);
    tcase_add_test(tc, saved_output_with_history);
    suite_add_tcase(s, tc);
    return s;
}
