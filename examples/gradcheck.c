/* gradcheck.c: checking the gradient of a function you wrote yourself.
 *
 * f(x, w, b) = mean(softmax(tanh(x @ w + b), dim -1) * x)
 * nb_gradcheck compares the analytic Jacobian (backward) with central finite
 * differences, element by element, in f64, and reports the worst entry. */
#include <stdio.h>

#include "nabla.h"

static nb_tensor *f(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[0], in[1]), in[2])); /* (4,3) */
    return nb_mean_all(nb_mul(nb_softmax(h, -1), in[0]));
}

/* relu has a kink at 0: there the two derivatives disagree */
static nb_tensor *relu(nb_tensor **in, int n, void *ctx) {
    (void)n;
    (void)ctx;
    return nb_relu(in[0]);
}

int main(void) {
    nb_rng rng;
    nb_rng_seed(&rng, 42);
    nb_tensor *in[3] = {nb_randn(NB_F64, NB_SHAPE(4, 3), &rng),
                        nb_randn(NB_F64, NB_SHAPE(3, 3), &rng),
                        nb_randn(NB_F64, NB_SHAPE(3), &rng)};
    for (int i = 0; i < 3; i++) nb_set_requires_grad(in[i], true);

    nb_gradcheck_result r;
    bool ok = nb_gradcheck(f, NULL, 3, in, NULL, &r); /* eps 1e-6, atol 1e-5, rtol 1e-3 */
    printf("f(x, w, b): %s\n  %s\n", ok ? "passed" : "FAILED", r.message);

    nb_tensor *z = nb_set_requires_grad(nb_zeros(NB_F64, NB_SHAPE(2)), true);
    bool kink = nb_gradcheck(relu, NULL, 1, &z, NULL, &r);
    printf("relu at 0 (expected to fail): %s\n  %s\n", kink ? "passed" : "failed", r.message);
    nb_clear_error();

    for (int i = 0; i < 3; i++) nb_free(in[i]);
    nb_free(z);
    return ok && !kink ? 0 : 1;
}
