/* test_second_order.c: second derivatives and forward mode on the problems of
 * examples/newton.c and examples/gradient_penalty.c, against the analytic
 * Hessian and PyTorch 1.13 (tests/fixtures/gen_second_order.py, f64):
 * Rosenbrock's Hessian from nb_autograd_grad twice at five points and
 * Newton's path to (1, 1); a tanh MLP's Hessian-vector product (double
 * backward) and its loss's directional derivative (nb_jvp); a WGAN-GP
 * critic's gradient-penalty step (loss, every parameter gradient) and ten
 * Adam steps. The models are written again here, as small as the examples'. */
#include "test_util.h"

static const char *FX = "second_order.txt";
#define TOL 1e-12 /* relative, for the exact problems (Rosenbrock) */

#define CHECK_OK(rc) ck_assert_msg((rc) == 0, "%s", nb_last_error() ? nb_last_error() : "?")

static nb_tensor *F(const char *name) { return fx(FX, name); }

/* The examples' simple values: element i is ((a i + b) % m - (m - 1) / 2) / d. */
static nb_tensor *pattern(int ndim, const int64_t *shape, int a, int b, int m, double d) {
    double v[64];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    ck_assert(n <= 64);
    for (int64_t i = 0; i < n; i++) v[i] = ((a * i + b) % m - (m - 1) / 2.0) / d;
    return nb_from_data(NB_F64, ndim, shape, v);
}

/* A pattern that must be the fixture's starting value `name`, bit for bit. */
static nb_tensor *start(const char *name, nb_tensor *t) {
    expect_close(t, F(name), 0, 0);
    return t;
}

/* ------------------------------------------------------------- Rosenbrock */
/* p (2) -> (1 - x)^2 + 100 (y - x^2)^2 */
static nb_tensor *rosenbrock(nb_tensor *p) {
    nb_tensor *x = nb_select(p, 0, 0), *y = nb_select(p, 0, 1);
    nb_tensor *a = nb_add_scalar(nb_neg(x), 1);
    nb_tensor *b = nb_sub(y, nb_mul(x, x));
    return nb_add(nb_mul(a, a), nb_mul_scalar(nb_mul(b, b), 100));
}

/* g (2) and H (2,2) of f at (x, y), H's rows the gradients of g_0 and g_1 */
static void rosen_derivatives(double x, double y, double g[2], double H[4]) {
    nb_scope_begin();
    nb_tensor *p = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(2), (double[]){x, y}), true);
    nb_tensor *f = rosenbrock(p), *grad;
    CHECK_OK(nb_autograd_grad(&f, 1, NULL, &p, 1, &(nb_backward_opts){.create_graph = true}, &grad));
    ck_assert_msg(nb_requires_grad(grad), "the gradient has no graph under create_graph");
    CHECK_OK(nb_copy_to_f64(grad, g));
    for (int i = 0; i < 2; i++) {
        nb_tensor *e = nb_from_data(NB_F64, NB_SHAPE(2), (double[]){i == 0, i == 1}), *row;
        CHECK_OK(nb_autograd_grad(&grad, 1, &e, &p, 1,
                                  &(nb_backward_opts){.retain_graph = i == 0}, &row));
        ck_assert_msg(row != NULL, "row %d of the Hessian: the gradient does not reach p", i);
        CHECK_OK(nb_copy_to_f64(row, H + 2 * i));
    }
    nb_scope_end();
}

static void expect_near(double got, double want, double tol, const char *what, int i) {
    ck_assert_msg(fabs(got - want) <= tol * fmax(1, fabs(want)), "%s %d: %.17g, expected %.17g",
                  what, i, got, want);
}

START_TEST(test_rosenbrock_hessian) {
    nb_tensor *pts = F("rosen_points"), *tg = F("rosen_grad"), *th = F("rosen_hess");
    int64_t live = nb_live_tensors();
    double p[10], want_g[10], want_h[20];
    CHECK_OK(nb_copy_to_f64(pts, p) || nb_copy_to_f64(tg, want_g) || nb_copy_to_f64(th, want_h));
    for (int k = 0; k < 5; k++) {
        double x = p[2 * k], y = p[2 * k + 1], g[2], H[4];
        rosen_derivatives(x, y, g, H);
        double gA[2] = {-2 * (1 - x) - 400 * x * (y - x * x), 200 * (y - x * x)};
        double HA[4] = {2 - 400 * y + 1200 * x * x, -400 * x, -400 * x, 200};
        for (int i = 0; i < 2; i++) {
            expect_near(g[i], gA[i], TOL, "gradient vs analytic, entry", 2 * k + i);
            expect_near(g[i], want_g[2 * k + i], TOL, "gradient vs torch, entry", 2 * k + i);
        }
        for (int i = 0; i < 4; i++) {
            expect_near(H[i], HA[i], TOL, "Hessian vs analytic, entry", 4 * k + i);
            expect_near(H[i], want_h[4 * k + i], TOL, "Hessian vs torch, entry", 4 * k + i);
        }
    }
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* Newton's iterates from (-1.2, 1): PyTorch's, step for step, to (1, 1) */
START_TEST(test_newton_path) {
    nb_tensor *want = F("newton_path");
    int64_t steps = nb_shape(want)[0] - 1;
    double path[2 * 16];
    ck_assert(steps < 16);
    CHECK_OK(nb_copy_to_f64(want, path));
    double x = -1.2, y = 1;
    for (int64_t k = 0;; k++) {
        expect_near(x, path[2 * k], TOL, "x at step", (int)k);
        expect_near(y, path[2 * k + 1], TOL, "y at step", (int)k);
        double g[2], H[4];
        rosen_derivatives(x, y, g, H);
        if (hypot(g[0], g[1]) <= 1e-12) {
            ck_assert_int_eq(k, steps);
            break;
        }
        ck_assert_int_lt(k, steps);
        double det = H[0] * H[3] - H[1] * H[2];
        x -= (H[3] * g[0] - H[1] * g[1]) / det;
        y -= (H[0] * g[1] - H[2] * g[0]) / det;
    }
}
END_TEST

/* ------------------------------------------------------------- MLP, Hv */
enum { NP = 4 };
static const char *const MLP[NP] = {"W1", "b1", "W2", "b2"};
typedef struct {
    nb_tensor *X, *Y;
} mlp_data;

static nb_tensor *mlp_loss(nb_tensor **w, int n, void *ctx) {
    (void)n;
    const mlp_data *d = ctx;
    nb_tensor *h = nb_tanh(nb_linear(d->X, w[0], w[1]));
    nb_tensor *r = nb_sub(nb_linear(h, w[2], w[3]), d->Y);
    return nb_mean_all(nb_mul(r, r));
}

/* The example's data, parameters (requiring grad) and direction */
static void mlp_problem(mlp_data *d, nb_tensor **w, nb_tensor **v) {
    d->X = start("mlp_X", pattern(NB_SHAPE(6, 2), 7, 3, 10, 4));
    d->Y = start("mlp_Y", pattern(NB_SHAPE(6, 1), 5, 1, 6, 4));
    w[0] = start("mlp_W1", pattern(NB_SHAPE(4, 2), 3, 1, 8, 6));
    w[1] = start("mlp_b1", pattern(NB_SHAPE(4), 5, 1, 6, 10));
    w[2] = start("mlp_W2", pattern(NB_SHAPE(1, 4), 3, 2, 8, 4));
    w[3] = start("mlp_b2", pattern(NB_SHAPE(1), 1, 1, 4, 10));
    v[0] = start("mlp_vW1", pattern(NB_SHAPE(4, 2), 5, 2, 12, 6));
    v[1] = start("mlp_vb1", pattern(NB_SHAPE(4), 3, 1, 8, 4));
    v[2] = start("mlp_vW2", pattern(NB_SHAPE(1, 4), 7, 5, 10, 5));
    v[3] = start("mlp_vb2", pattern(NB_SHAPE(1), 1, 0, 2, 2));
    for (int i = 0; i < NP; i++) nb_set_requires_grad(w[i], true);
}

static nb_tensor *Fmlp(const char *prefix, int i) {
    char name[32];
    snprintf(name, sizeof name, "mlp_%s%s", prefix, MLP[i]);
    return F(name);
}

START_TEST(test_mlp_hessian_vector_product) {
    nb_tensor *want_loss = F("mlp_loss"), *want_gv = F("mlp_gv"); /* loads the file */
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    mlp_data d;
    nb_tensor *w[NP], *v[NP], *g[NP], *hv[NP];
    mlp_problem(&d, w, v);
    nb_tensor *loss = mlp_loss(w, NP, &d);
    expect_close(loss, want_loss, 1e-14, 1e-12);
    CHECK_OK(nb_autograd_grad(&loss, 1, NULL, w, NP, &(nb_backward_opts){.create_graph = true}, g));
    nb_tensor *gv = NULL;
    for (int i = 0; i < NP; i++) {
        expect_close(g[i], Fmlp("g", i), 1e-14, 1e-10);
        nb_tensor *t = nb_sum_all(nb_mul(g[i], v[i]));
        gv = gv ? nb_add(gv, t) : t;
    }
    expect_close(gv, want_gv, 1e-14, 1e-10);
    CHECK_OK(nb_autograd_grad(&gv, 1, NULL, w, NP, NULL, hv));
    for (int i = 0; i < NP; i++) expect_close(hv[i], Fmlp("hv", i), 1e-14, 1e-10);
    for (int i = 0; i < NP; i++) ck_assert_ptr_null(nb_grad(w[i])); /* no .grad touched */
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* The loss's derivative along v in forward mode is g . v (PyTorch's) */
START_TEST(test_mlp_jvp) {
    nb_tensor *want_loss = F("mlp_loss"), *want_gv = F("mlp_gv");
    int64_t live = nb_live_tensors();
    nb_scope_begin();
    mlp_data d;
    nb_tensor *w[NP], *v[NP], *out, *dout;
    mlp_problem(&d, w, v);
    CHECK_OK(nb_jvp(mlp_loss, &d, NP, w, v, &out, &dout));
    expect_close(out, want_loss, 1e-14, 1e-12);
    expect_close(dout, want_gv, 1e-14, 1e-10);
    nb_scope_end();
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

/* ------------------------------------------------------ WGAN-GP critic */
#define GP_N 8
#define GP_STEPS 10
static const char *const CRITIC[6] = {"l1.weight", "l1.bias", "l2.weight",
                                      "l2.bias", "l3.weight", "l3.bias"};

static nb_tensor *critic(nb_tensor **p, nb_tensor *x) {
    nb_tensor *h = nb_tanh(nb_linear(x, p[0], p[1]));
    h = nb_tanh(nb_linear(h, p[2], p[3]));
    return nb_linear(h, p[4], p[5]);
}

/* loss = mean(D(fake)) - mean(D(real)) + 10 mean((|dD(x_hat)/dx_hat|_2 - 1)^2),
 * backpropagated into the parameters' .grad; the penalty goes to *penalty. */
static double critic_loss_backward(nb_tensor **p, nb_tensor *real, nb_tensor *fake,
                                   nb_tensor *alpha, double *penalty) {
    nb_scope_begin();
    nb_tensor *x_hat = nb_add(nb_mul(alpha, real), nb_mul(nb_add_scalar(nb_neg(alpha), 1), fake));
    nb_set_requires_grad(x_hat, true);
    nb_tensor *d = critic(p, x_hat), *ones = nb_ones(NB_F64, NB_SHAPE(GP_N, 1)), *gx;
    CHECK_OK(nb_autograd_grad(&d, 1, &ones, &x_hat, 1, &(nb_backward_opts){.create_graph = true},
                              &gx));
    ck_assert_msg(nb_requires_grad(gx), "dD/dx_hat has no graph under create_graph");
    nb_tensor *dev = nb_add_scalar(nb_sqrt(nb_sum(nb_mul(gx, gx), 1, false)), -1);
    nb_tensor *gp = nb_mul_scalar(nb_mean_all(nb_mul(dev, dev)), 10);
    nb_tensor *loss = nb_add(nb_sub(nb_mean_all(critic(p, fake)), nb_mean_all(critic(p, real))), gp);
    ck_assert_msg(loss != NULL, "%s", nb_last_error());
    CHECK_OK(nb_backward(loss));
    double l = nb_item(loss);
    *penalty = nb_item(gp);
    nb_scope_end();
    return l;
}

static nb_tensor *Fgp(const char *prefix, int i) {
    char name[48];
    snprintf(name, sizeof name, "gp_%s%s", prefix, CRITIC[i]);
    return F(name);
}

START_TEST(test_gradient_penalty_step) {
    nb_tensor *want_loss = F("gp_loss"), *want_pen = F("gp_penalty");
    int64_t live = nb_live_tensors();
    nb_params *ps = nb_params_new();
    nb_tensor *p[6];
    nb_scope_begin();
    nb_tensor *init[6] = {pattern(NB_SHAPE(8, 2), 3, 1, 10, 3), pattern(NB_SHAPE(8), 3, 2, 8, 8),
                          pattern(NB_SHAPE(8, 8), 7, 3, 12, 10), pattern(NB_SHAPE(8), 5, 1, 6, 16),
                          pattern(NB_SHAPE(1, 8), 3, 1, 10, 6), pattern(NB_SHAPE(1), 1, 1, 4, 10)};
    for (int i = 0; i < 6; i++) {
        expect_close(init[i], Fgp("", i), 0, 0);
        p[i] = nb_params_add(ps, CRITIC[i], init[i]);
        ck_assert_ptr_nonnull(p[i]);
    }
    nb_tensor *real = start("gp_real", pattern(NB_SHAPE(GP_N, 2), 3, 1, 16, 4));
    nb_tensor *fake = start("gp_fake", pattern(NB_SHAPE(GP_N, 2), 5, 4, 16, 24));
    double a[GP_N], losses[GP_STEPS], pens[GP_STEPS];
    for (int i = 0; i < GP_N; i++) a[i] = (2 * i + 1) / 16.0;
    nb_tensor *alpha = start("gp_alpha", nb_from_data(NB_F64, NB_SHAPE(GP_N, 1), a));
    nb_optim *opt = nb_adam(ps, 5e-3, 0.5, 0.9, 1e-8, 0);
    ck_assert_ptr_nonnull(opt);
    for (int step = 0; step < GP_STEPS; step++) {
        nb_optim_clear_grad(opt);
        losses[step] = critic_loss_backward(p, real, fake, alpha, &pens[step]);
        if (step == 0) /* the gradients that flow through dD/dx_hat: PyTorch's */
            for (int i = 0; i < 6; i++) {
                ck_assert_msg(nb_grad(p[i]) != NULL, "%s has no gradient", CRITIC[i]);
                expect_close(nb_grad(p[i]), Fgp("grad_", i), 1e-12, 1e-10);
            }
        nb_optim_step(opt);
    }
    nb_tensor *got_loss = nb_from_data(NB_F64, NB_SHAPE(GP_STEPS), losses);
    nb_tensor *got_pen = nb_from_data(NB_F64, NB_SHAPE(GP_STEPS), pens);
    expect_close(got_loss, want_loss, 1e-12, 1e-10);
    expect_close(got_pen, want_pen, 1e-12, 1e-10);
    for (int i = 0; i < 6; i++) expect_close(p[i], Fgp("final_", i), 1e-12, 1e-10);
    nb_scope_end();
    nb_optim_free(opt);
    nb_params_free(ps);
    ck_assert_int_eq(nb_live_tensors(), live);
}
END_TEST

Suite *suite_second_order(void) {
    Suite *s = suite_create("second_order");
    TCase *tc = tcase_create("vs_torch");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_rosenbrock_hessian);
    tcase_add_test(tc, test_newton_path);
    tcase_add_test(tc, test_mlp_hessian_vector_product);
    tcase_add_test(tc, test_mlp_jvp);
    tcase_add_test(tc, test_gradient_penalty_step);
    suite_add_tcase(s, tc);
    return s;
}
