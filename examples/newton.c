/* newton.c: second derivatives from nb_autograd_grad.
 *
 * 1. Newton's method on Rosenbrock's function f(x, y) = (1 - x)^2 + 100 (y - x^2)^2
 *    from (-1.2, 1). The gradient g comes from nb_autograd_grad with create_graph, so
 *    it is itself differentiable; row i of the Hessian is the gradient of g_i (g
 *    weighted by the unit vector e_i). Each step solves H d = -g and prints the
 *    iterate, until the minimum (1, 1).
 * 2. A Hessian-vector product on a small network (a 2-layer tanh MLP, f64) by the
 *    double-backward trick: g = grad(loss) with create_graph, then grad(g . v). It
 *    is compared with central differences of the gradient, and the loss's
 *    directional derivative in forward mode (nb_jvp) with g . v.
 * tests/test_second_order.c checks the same numbers against PyTorch's.
 *
 *   build/examples/newton
 */
#include <math.h>
#include <stdio.h>

#include "nabla.h"

/* p (2) -> f(p[0], p[1]) (0-d) */
static nb_tensor *rosenbrock(nb_tensor *p) {
    nb_tensor *x = nb_select(p, 0, 0), *y = nb_select(p, 0, 1);
    nb_tensor *a = nb_add_scalar(nb_neg(x), 1); /* 1 - x */
    nb_tensor *b = nb_sub(y, nb_mul(x, x));     /* y - x^2 */
    return nb_add(nb_mul(a, a), nb_mul_scalar(nb_mul(b, b), 100));
}

/* The gradient g and Hessian H of f at p (a leaf that requires grad), from
 * nb_autograd_grad twice. 0, or -1 with the message set. */
static int grad_and_hessian(nb_tensor *p, double g[2], double H[2][2]) {
    nb_scope_begin();
    nb_tensor *f = rosenbrock(p), *grad = NULL;
    int rc = nb_autograd_grad(&f, 1, NULL, &p, 1, &(nb_backward_opts){.create_graph = true}, &grad);
    rc = rc ? rc : nb_copy_to_f64(grad, g);
    for (int i = 0; i < 2 && !rc; i++) {
        nb_tensor *e = nb_from_data(NB_F64, NB_SHAPE(2), (double[]){i == 0, i == 1}), *row;
        /* the graph of g is walked twice: keep it for the second row */
        rc = nb_autograd_grad(&grad, 1, &e, &p, 1, &(nb_backward_opts){.retain_graph = i == 0},
                              &row);
        rc = rc ? rc : nb_copy_to_f64(row, H[i]);
    }
    nb_scope_end();
    return rc;
}

/* The number of Newton steps from (-1.2, 1) to (1, 1), printing each; -1 on error. */
static int newton(void) {
    nb_tensor *p = nb_set_requires_grad(nb_from_data(NB_F64, NB_SHAPE(2), (double[]){-1.2, 1}), true);
    if (!p) return -1;
    double *x = nb_data(p); /* p's values, updated in place */
    printf("Newton's method on Rosenbrock's function from (%g, %g)\n", x[0], x[1]);
    int step = 0, rc = 0;
    for (;; step++) {
        double g[2], H[2][2];
        if ((rc = grad_and_hessian(p, g, H))) break;
        double gnorm = hypot(g[0], g[1]);
        if (step == 0) {
            double A[2][2] = {{2 - 400 * x[1] + 1200 * x[0] * x[0], -400 * x[0]}, {-400 * x[0], 200}};
            double dev = 0;
            for (int i = 0; i < 4; i++) dev = fmax(dev, fabs(H[i / 2][i % 2] - A[i / 2][i % 2]));
            printf("  Hessian there: [[%g, %g], [%g, %g]]; the analytic one differs by %g\n",
                   H[0][0], H[0][1], H[1][0], H[1][1], dev);
        }
        printf("  step %d: (%.15f, %.15f)  |grad| %.3e\n", step, x[0], x[1], gnorm);
        if (gnorm <= 1e-12 || step == 50) break;
        /* H d = -g by Cramer's rule (H is 2x2, positive definite along the way) */
        double det = H[0][0] * H[1][1] - H[0][1] * H[1][0];
        x[0] -= (H[1][1] * g[0] - H[0][1] * g[1]) / det;
        x[1] -= (H[0][0] * g[1] - H[1][0] * g[0]) / det;
        nb_mark_modified(p);
    }
    bool at_min = !rc && fabs(x[0] - 1) <= 1e-12 && fabs(x[1] - 1) <= 1e-12;
    nb_free(p);
    return at_min ? step : -1;
}

/* ------------------------------------------------------ the MLP's Hessian */
/* Element i (row-major) is ((a i + b) % m - (m - 1) / 2) / d: simple values that
 * tests/fixtures/gen_second_order.py makes the same way (m even: never 0). */
static nb_tensor *pattern(int ndim, const int64_t *shape, int a, int b, int m, double d) {
    double v[64];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    for (int64_t i = 0; i < n && i < 64; i++) v[i] = ((a * i + b) % m - (m - 1) / 2.0) / d;
    return n <= 64 ? nb_from_data(NB_F64, ndim, shape, v) : NULL;
}

enum { NP = 4 }; /* W1 (4,2), b1 (4), W2 (1,4), b2 (1) */
typedef struct {
    nb_tensor *X, *Y; /* (6,2) points, (6,1) targets */
} data;

/* mean((W2 tanh(X W1^T + b1) + b2 - Y)^2); an nb_fn, so nb_jvp can run it */
static nb_tensor *mlp_loss(nb_tensor **w, int n, void *ctx) {
    (void)n;
    const data *d = ctx;
    nb_tensor *h = nb_tanh(nb_linear(d->X, w[0], w[1]));
    nb_tensor *r = nb_sub(nb_linear(h, w[2], w[3]), d->Y);
    return nb_mean_all(nb_mul(r, r));
}

/* The gradient of the loss at w, in gs; create_graph keeps it differentiable. */
static int mlp_grad(const data *d, nb_tensor **w, nb_tensor **gs, bool create_graph) {
    nb_tensor *loss = mlp_loss(w, NP, (void *)d);
    return nb_autograd_grad(&loss, 1, NULL, w, NP, &(nb_backward_opts){.create_graph = create_graph},
                            gs);
}

/* sum_i sum(a[i] * b[i]) */
static nb_tensor *dot(nb_tensor **a, nb_tensor **b) {
    nb_tensor *s = nb_sum_all(nb_mul(a[0], b[0]));
    for (int i = 1; i < NP; i++) s = nb_add(s, nb_sum_all(nb_mul(a[i], b[i])));
    return s;
}

/* The largest |a - b| over the NP tensor pairs; NaN on error. */
static double max_diff(nb_tensor **a, nb_tensor **b) {
    double m = 0;
    for (int i = 0; i < NP; i++) {
        nb_tensor *d = nb_sub(a[i], b[i]);
        double v[64];
        if (!d || nb_numel(d) > 64 || nb_copy_to_f64(d, v)) return NAN;
        for (int64_t j = 0; j < nb_numel(d); j++) m = fmax(m, fabs(v[j]));
    }
    return m;
}

/* (g(w + eps v) - g(w - eps v)) / (2 eps), plain gradients at two new leaves:
 * Hv up to eps^2 and rounding */
static int central_differences(const data *d, nb_tensor **w, nb_tensor **v, nb_tensor **fd) {
    const double eps = 1e-5;
    nb_tensor *wp[NP], *wm[NP], *gp[NP], *gm[NP];
    for (int i = 0; i < NP; i++) {
        nb_tensor *step = nb_mul_scalar(v[i], eps);
        wp[i] = nb_set_requires_grad(nb_detach(nb_add(w[i], step)), true);
        wm[i] = nb_set_requires_grad(nb_detach(nb_sub(w[i], step)), true);
    }
    if (mlp_grad(d, wp, gp, false) || mlp_grad(d, wm, gm, false)) return -1;
    for (int i = 0; i < NP; i++) fd[i] = nb_mul_scalar(nb_sub(gp[i], gm[i]), 0.5 / eps);
    return 0;
}

/* Hv by double backward, against central differences of the gradient along v;
 * the directional derivative by nb_jvp against g . v. true when both agree. */
static bool hessian_vector(void) {
    nb_scope_begin();
    data d = {pattern(NB_SHAPE(6, 2), 7, 3, 10, 4), pattern(NB_SHAPE(6, 1), 5, 1, 6, 4)};
    nb_tensor *w[NP] = {pattern(NB_SHAPE(4, 2), 3, 1, 8, 6), pattern(NB_SHAPE(4), 5, 1, 6, 10),
                        pattern(NB_SHAPE(1, 4), 3, 2, 8, 4), pattern(NB_SHAPE(1), 1, 1, 4, 10)};
    nb_tensor *v[NP] = {pattern(NB_SHAPE(4, 2), 5, 2, 12, 6), pattern(NB_SHAPE(4), 3, 1, 8, 4),
                        pattern(NB_SHAPE(1, 4), 7, 5, 10, 5), pattern(NB_SHAPE(1), 1, 0, 2, 2)};
    for (int i = 0; i < NP; i++) nb_set_requires_grad(w[i], true);

    nb_tensor *g[NP], *hv[NP], *fd[NP], *gv = NULL, *loss, *dloss;
    bool ok = mlp_grad(&d, w, g, true) == 0 && (gv = dot(g, v)) &&
              nb_autograd_grad(&gv, 1, NULL, w, NP, NULL, hv) == 0 &&
              central_differences(&d, w, v, fd) == 0 &&
              nb_jvp(mlp_loss, &d, NP, w, v, &loss, &dloss) == 0;
    double hv_err = ok ? max_diff(hv, fd) : NAN;
    if (!ok || isnan(hv_err)) {
        printf("Hessian-vector product failed: %s\n", nb_last_error());
        nb_scope_end();
        return false;
    }
    double jv = nb_item(dloss), ref = nb_item(gv);
    printf("Hessian-vector product of a tanh MLP's loss (17 parameters, loss %.6f)\n",
           nb_item(loss));
    printf("  Hv, b1's part: ");
    nb_print(hv[1]);
    printf("  max |Hv - central differences of the gradient| = %.1e\n", hv_err);
    printf("  directional derivative: nb_jvp %.12f, g . v %.12f\n", jv, ref);
    nb_scope_end();
    return hv_err < 1e-7 && fabs(jv - ref) < 1e-12;
}

int main(void) {
    int steps = newton();
    if (steps < 0) {
        const char *why = nb_last_error();
        printf("newton: FAILED: %s\n", why ? why : "did not reach (1, 1) in 50 steps");
        return 1;
    }
    bool hv = hessian_vector();
    printf("newton: converged to (1, 1) in %d steps; Hv and the jvp %s\n", steps,
           hv ? "agree with the references" : "DISAGREE");
    return hv ? 0 : 1;
}
