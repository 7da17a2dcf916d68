/* train_loop.c: the smallest complete training loop: a 2-16-1 tanh network
 * learns XOR with plain gradient descent. Everything made inside a step lives
 * in that step's scope; only the parameters (made outside) persist. */
#include <stdio.h>

#include "nabla.h"

int main(void) {
    nb_rng rng;
    nb_rng_seed(&rng, 0);
    nb_tensor *x = nb_from_data(NB_F32, NB_SHAPE(4, 2), (float[]){0, 0, 0, 1, 1, 0, 1, 1});
    nb_tensor *y = nb_from_data(NB_F32, NB_SHAPE(4, 1), (float[]){0, 1, 1, 0});
    /* Made inside a scope and handed out with nb_keep, the parameters become
     * persistent (the temporaries of their initialization do not). */
    nb_scope_begin();
    nb_tensor *params[4] = {
        nb_keep(nb_mul_scalar(nb_randn(NB_F32, NB_SHAPE(2, 16), &rng), 0.5)), /* w1 */
        nb_keep(nb_zeros(NB_F32, NB_SHAPE(16))),                              /* b1 */
        nb_keep(nb_mul_scalar(nb_randn(NB_F32, NB_SHAPE(16, 1), &rng), 0.5)), /* w2 */
        nb_keep(nb_zeros(NB_F32, NB_SHAPE(1))),                               /* b2 */
    };
    nb_scope_end();
    for (int i = 0; i < 4; i++) nb_set_requires_grad(params[i], true);

    double loss_value = 0;
    for (int step = 0; step <= 2000; step++) {
        nb_scope_begin();
        nb_tensor *h = nb_tanh(nb_add(nb_matmul(x, params[0]), params[1]));
        nb_tensor *pred = nb_add(nb_matmul(h, params[2]), params[3]);
        nb_tensor *diff = nb_sub(pred, y);
        nb_tensor *loss = nb_mean_all(nb_mul(diff, diff));
        if (!loss || nb_backward(loss) != 0) {
            fprintf(stderr, "error: %s\n", nb_last_error());
            return 1;
        }
        loss_value = nb_item(loss);
        nb_set_grad_enabled(false); /* the update is not part of any graph */
        for (int i = 0; i < 4; i++) {
            nb_copy_into(params[i], nb_sub(params[i], nb_mul_scalar(nb_grad(params[i]), 0.1)));
            nb_zero_grad(params[i]);
        }
        nb_set_grad_enabled(true);
        if (step % 400 == 0) printf("step %4d  loss %.6f\n", step, loss_value);
        nb_scope_end();
    }

    nb_scope_begin();
    nb_tensor *h = nb_tanh(nb_add(nb_matmul(x, params[0]), params[1]));
    nb_tensor *pred = nb_add(nb_matmul(h, params[2]), params[3]);
    printf("predictions for (0,0) (0,1) (1,0) (1,1): ");
    for (int i = 0; i < 4; i++) printf("%.3f ", nb_item(nb_select(pred, 0, i)));
    printf("\n");
    nb_scope_end();

    for (int i = 0; i < 4; i++) nb_free(params[i]);
    nb_free(x);
    nb_free(y);
    return loss_value < 1e-3 ? 0 : 1;
}
