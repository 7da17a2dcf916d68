/* batchnorm.c: torch.nn.BatchNorm1d and BatchNorm2d over nb_batch_norm.
 *
 * Parameters weight (ones) and bias (zeros), buffers running_mean (zeros),
 * running_var (ones) and num_batches_tracked (0-d i64, 0), registered under
 * torch's state_dict names, so nb_save / nb_load and safetensors move them to
 * and from torch. In training a forward normalizes with the batch's
 * statistics, updates the running ones in place (nb_batch_norm) and adds 1
 * to num_batches_tracked; in eval it uses the running ones. torch's
 * momentum=None (a cumulative average) is not offered. */
#include <math.h>

#include "nn_internal.h"

static int batchnorm_init_body(nb_BatchNorm *m, nb_params *ps, const char *name, int64_t c,
                               double eps, double momentum, int dims, const char *fn) {
    if (!m || !ps) return (nn_error("%s: module or registry is NULL", fn), -1);
    if (c <= 0)
        return (nn_error("%s: num_features must be positive, got %lld", fn, (long long)c), -1);
    if (!(eps > 0) || isinf(eps))
        return (nn_error("%s: eps must be finite and > 0, got %g", fn, eps), -1);
    if (!(momentum >= 0 && momentum <= 1))
        return (nn_error("%s: momentum must be in [0, 1], got %g", fn, momentum), -1);
    *m = (nb_BatchNorm){.num_features = c, .eps = eps, .momentum = momentum, .training = true,
                        .dims = dims};
    char buf[512];
    nb_dtype dt = nb_default_dtype();
    nb_scope_begin();
    m->weight = nb_params_add(ps, nn_join(fn, buf, sizeof buf, name, "weight"), nb_ones(dt, 1, &c));
    if (m->weight)
        m->bias = nb_params_add(ps, nn_join(fn, buf, sizeof buf, name, "bias"), nb_zeros(dt, 1, &c));
    if (m->bias)
        m->running_mean = nn_params_add_checked(ps, nn_join(fn, buf, sizeof buf, name, "running_mean"),
                                                nb_zeros(dt, 1, &c), NN_VALUES_FINITE);
    if (m->running_mean)
        m->running_var = nn_params_add_checked(ps, nn_join(fn, buf, sizeof buf, name, "running_var"),
                                               nb_ones(dt, 1, &c), NN_VALUES_FINITE_NONNEG);
    if (m->running_var)
        m->num_batches_tracked =
            nn_params_add_checked(ps, nn_join(fn, buf, sizeof buf, name, "num_batches_tracked"),
                                  nb_zeros(NB_I64, 0, NULL), NN_VALUES_STEP);
    nb_scope_end();
    return m->num_batches_tracked ? 0 : -1;
}

int nb_batchnorm1d_init(nb_BatchNorm *m, nb_params *ps, const char *name, int64_t num_features,
                        double eps, double momentum) {
    const char *fn = "nb_batchnorm1d_init";
    nn_enter();
    return nn_leave_rc(fn, batchnorm_init_body(m, ps, name, num_features, eps, momentum, 1, fn));
}

int nb_batchnorm2d_init(nb_BatchNorm *m, nb_params *ps, const char *name, int64_t num_features,
                        double eps, double momentum) {
    const char *fn = "nb_batchnorm2d_init";
    nn_enter();
    return nn_leave_rc(fn, batchnorm_init_body(m, ps, name, num_features, eps, momentum, 2, fn));
}

/* x: (N, C) or (N, C, L) for BatchNorm1d, (N, C, H, W) for BatchNorm2d, C = num_features */
static bool check_input(const nb_BatchNorm *m, nb_tensor *x, const char *fn) {
    int nd = nb_ndim(x);
    char bx[128];
    if (m->dims == 1 && nd != 2 && nd != 3)
        return nn_error("%s: BatchNorm1d expects a 2-d (N, C) or 3-d (N, C, L) input, got %d-d %s",
                        fn, nd, NN_SHAPE(bx, x)), false;
    if (m->dims == 2 && nd != 4)
        return nn_error("%s: BatchNorm2d expects a 4-d (N, C, H, W) input, got %d-d %s", fn, nd,
                        NN_SHAPE(bx, x)), false;
    if (nb_shape(x)[1] != m->num_features)
        return nn_error("%s: input %s has %lld channels (dim 1), the module %lld num_features", fn,
                        NN_SHAPE(bx, x), (long long)nb_shape(x)[1],
                        (long long)m->num_features), false;
    return true;
}

static nb_tensor *batchnorm_forward_body(nb_BatchNorm *m, nb_tensor *x) {
    const char *fn = "nb_batchnorm_forward";
    if (!m) return nn_error("%s: module is NULL", fn);
    if (!nn_input(fn, x, 0)) return NULL;
    if ((m->dims != 1 && m->dims != 2) || !m->num_batches_tracked)
        return nn_error("%s: module not initialized (nb_batchnorm1d_init / 2d_init)", fn);
    if (!check_input(m, x, fn)) return NULL;
    nb_tensor *y = nb_batch_norm(x, m->running_mean, m->running_var, m->weight, m->bias,
                                 m->training, m->momentum, m->eps);
    if (!y || !m->training) return y;
    int64_t steps = *(const int64_t *)nb_data(m->num_batches_tracked);
    nb_tensor *next = nb_scalar(NB_I64, (double)(steps + 1));
    if (!next || nb_copy_into(m->num_batches_tracked, next) != 0) return NULL;
    nb_free(next);
    return y;
}

nb_tensor *nb_batchnorm_forward(nb_BatchNorm *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_batchnorm_forward", batchnorm_forward_body(m, x));
}
