/* gradient_penalty.c: a WGAN-GP critic step, a loss that holds a gradient.
 *
 * The critic D (an MLP 2 -> 8 -> 8 -> 1 with tanh, f64) learns to score real
 * points above fake ones while its slope stays near 1 (Gulrajani et al. 2017):
 *   loss = mean(D(fake)) - mean(D(real)) + lambda mean((|dD(x_hat)/dx_hat|_2 - 1)^2)
 * at x_hat = alpha real + (1 - alpha) fake, points between the two sets. The
 * inner gradient dD/dx_hat comes from nb_autograd_grad with create_graph, so
 * the penalty is differentiable in D's parameters: nb_backward(loss) fills
 * their .grad (second derivatives of D on the way) and Adam takes a step.
 * The points and alpha are fixed here (alpha is drawn uniformly in practice)
 * so that tests/test_second_order.c can check every number against PyTorch.
 *
 *   build/examples/gradient_penalty
 */
#include <math.h>
#include <stdio.h>

#include "nabla.h"

#define N 8         /* points of each kind */
#define LAMBDA 10.0 /* the penalty's weight, the paper's */
#define STEPS 10

/* Element i (row-major) is ((a i + b) % m - (m - 1) / 2) / d: simple values that
 * tests/fixtures/gen_second_order.py makes the same way (m even: never 0). */
static nb_tensor *pattern(int ndim, const int64_t *shape, int a, int b, int m, double d) {
    double v[64];
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    for (int64_t i = 0; i < n && i < 64; i++) v[i] = ((a * i + b) % m - (m - 1) / 2.0) / d;
    return n <= 64 ? nb_from_data(NB_F64, ndim, shape, v) : NULL;
}

typedef struct {
    nb_tensor *w[3], *b[3]; /* l1 (8,2) (8), l2 (8,8) (8), l3 (1,8) (1): borrowed from the registry */
} critic;

static int critic_init(critic *D, nb_params *ps) {
    nb_scope_begin();
    nb_tensor *init[6] = {pattern(NB_SHAPE(8, 2), 3, 1, 10, 3), pattern(NB_SHAPE(8), 3, 2, 8, 8),
                          pattern(NB_SHAPE(8, 8), 7, 3, 12, 10), pattern(NB_SHAPE(8), 5, 1, 6, 16),
                          pattern(NB_SHAPE(1, 8), 3, 1, 10, 6), pattern(NB_SHAPE(1), 1, 1, 4, 10)};
    static const char *names[6] = {"l1.weight", "l1.bias", "l2.weight",
                                   "l2.bias", "l3.weight", "l3.bias"};
    int rc = 0;
    for (int i = 0; i < 6 && !rc; i++) {
        nb_tensor *p = nb_params_add(ps, names[i], init[i]);
        if (i % 2) D->b[i / 2] = p;
        else D->w[i / 2] = p;
        rc = p ? 0 : -1;
    }
    nb_scope_end();
    return rc;
}

/* x (n, 2) -> scores (n, 1) */
static nb_tensor *critic_forward(const critic *D, nb_tensor *x) {
    nb_tensor *h = nb_tanh(nb_linear(x, D->w[0], D->b[0]));
    h = nb_tanh(nb_linear(h, D->w[1], D->b[1]));
    return nb_linear(h, D->w[2], D->b[2]);
}

/* lambda mean((|dD/dx|_2 - 1)^2) at x_hat, a leaf that requires grad; it
 * keeps its graph through D's parameters. */
static nb_tensor *gradient_penalty(const critic *D, nb_tensor *x_hat) {
    nb_tensor *d = critic_forward(D, x_hat), *ones = nb_ones(NB_F64, NB_SHAPE(N, 1)), *gx;
    if (nb_autograd_grad(&d, 1, &ones, &x_hat, 1, &(nb_backward_opts){.create_graph = true}, &gx))
        return NULL;
    nb_tensor *norm = nb_sqrt(nb_sum(nb_mul(gx, gx), 1, false)); /* (N) */
    nb_tensor *dev = nb_add_scalar(norm, -1);
    return nb_mul_scalar(nb_mean_all(nb_mul(dev, dev)), LAMBDA);
}

/* One critic step: the loss, its gradient in the parameters' .grad, an
 * optimizer step. The loss and the penalty go to *loss and *penalty. */
static int critic_step(const critic *D, nb_optim *opt, nb_tensor *real, nb_tensor *fake,
                       nb_tensor *alpha, double *loss, double *penalty) {
    nb_scope_begin();
    nb_optim_clear_grad(opt);
    /* no history: x_hat is a leaf, the variable of the inner gradient */
    nb_tensor *x_hat = nb_add(nb_mul(alpha, real), nb_mul(nb_add_scalar(nb_neg(alpha), 1), fake));
    nb_set_requires_grad(x_hat, true);
    nb_tensor *gp = gradient_penalty(D, x_hat);
    nb_tensor *wasserstein = nb_sub(nb_mean_all(critic_forward(D, fake)),
                                    nb_mean_all(critic_forward(D, real)));
    nb_tensor *l = nb_add(wasserstein, gp);
    int rc = l ? nb_backward(l) : -1;
    *loss = nb_item(l);
    *penalty = nb_item(gp);
    if (!rc) nb_optim_step(opt);
    nb_scope_end();
    return rc;
}

static double grad_norm(nb_tensor *p) {
    double v[64], s = 0;
    nb_tensor *g = nb_grad(p);
    if (!g || nb_numel(g) > 64 || nb_copy_to_f64(g, v)) return NAN;
    for (int64_t i = 0; i < nb_numel(g); i++) s += v[i] * v[i];
    return sqrt(s);
}

int main(void) {
    nb_params *ps = nb_params_new();
    critic D;
    nb_optim *opt = NULL;
    /* real points spread over [-1.9, 1.9]^2, fake ones bunched near 0 */
    nb_tensor *real = pattern(NB_SHAPE(N, 2), 3, 1, 16, 4);
    nb_tensor *fake = pattern(NB_SHAPE(N, 2), 5, 4, 16, 24);
    double a[N];
    for (int i = 0; i < N; i++) a[i] = (2 * i + 1) / 16.0;
    nb_tensor *alpha = nb_from_data(NB_F64, NB_SHAPE(N, 1), a);
    int rc = critic_init(&D, ps);
    if (!rc) rc = (opt = nb_adam(ps, 5e-3, 0.5, 0.9, 1e-8, 0)) ? 0 : -1;

    double first = NAN, loss = NAN, penalty;
    printf("WGAN-GP critic, %d real and %d fake points, lambda %g, Adam lr 5e-3 betas (0.5, 0.9)\n",
           N, N, LAMBDA);
    for (int step = 0; step < STEPS && !rc; step++) {
        rc = critic_step(&D, opt, real, fake, alpha, &loss, &penalty);
        if (rc) break;
        if (step == 0) {
            first = loss;
            /* l3.bias's is 0: a constant added to D cancels out of the loss */
            printf("  the first step's parameter gradients (norms):\n");
            for (int i = 0; i < nb_params_count(ps); i++) {
                const char *name;
                nb_tensor *p = nb_params_at(ps, i, &name);
                printf("    %-10s %.6f\n", name, grad_norm(p));
            }
        }
        printf("  step %d: loss %.6f (penalty %.6f)\n", step, loss, penalty);
    }
    if (rc)
        printf("gradient_penalty: FAILED: %s\n", nb_last_error());
    else if (!(loss < first))
        printf("gradient_penalty: FAILED: the loss went from %.6f to %.6f\n", first, loss);
    else
        printf("gradient_penalty: loss fell from %.6f to %.6f in %d steps\n", first, loss, STEPS);
    nb_optim_free(opt);
    nb_params_free(ps);
    nb_free(real);
    nb_free(fake);
    nb_free(alpha);
    return rc || !(loss < first) ? 1 : 0;
}
