/* linear.c: y = x w^T + b, as torch.nn.Linear, with its default init. */
#include <math.h>

#include "nn_internal.h"

/* x (..., in), w (out, in), b (out) -> (..., out) */
static nb_tensor *linear_body(nb_tensor *x, nb_tensor *w, nb_tensor *b) {
    const char *fn = "nb_linear";
    if (!nn_input(fn, x, 0) || !nn_input(fn, w, 1) || !nn_opt_input(fn, b, 2))
        return NULL;
    if (nb_dtype_of(x) != nb_dtype_of(w) || (b && nb_dtype_of(b) != nb_dtype_of(w)))
        return nn_error("%s: dtype mismatch: input %s, weight %s%s%s", fn,
                        nb_dtype_name(nb_dtype_of(x)), nb_dtype_name(nb_dtype_of(w)),
                        b ? ", bias " : "", b ? nb_dtype_name(nb_dtype_of(b)) : "");
    if (nb_ndim(w) != 2) return nn_error("%s: weight must be 2-d (out, in), got %d-d", fn, nb_ndim(w));
    int64_t in = nb_shape(w)[1], out = nb_shape(w)[0];
    if (nb_ndim(x) < 1) return nn_error("%s: input must be at least 1-d, got a 0-d tensor", fn);
    if (nb_shape(x)[nb_ndim(x) - 1] != in)
        return nn_error("%s: input's last dim (%lld) does not match weight (%lld,%lld)", fn,
                        (long long)nb_shape(x)[nb_ndim(x) - 1], (long long)out, (long long)in);
    if (b && (nb_ndim(b) != 1 || nb_shape(b)[0] != out))
        return nn_error("%s: bias must have shape (%lld)", fn, (long long)out);
    /* Fold the batch dims into rows: one (N, in) x (in, out) product, whose
     * backward gives the weight gradient in one product too, instead of a
     * batch of small products and a sum over the batch. */
    int nd = nb_ndim(x);
    /* rows counted, not -1: with in == 0 a -1 would be ambiguous (0 elements) */
    int64_t rows = 1;
    for (int i = 0; i < nd - 1; i++) rows *= nb_shape(x)[i];
    /* Intermediates are freed as soon as the next one exists: the graph
     * keeps what backward reads (x and w for the product), nothing more. */
    nb_tensor *x2 = nd == 2 ? x : nb_reshape(x, NB_SHAPE(rows, in));
    nb_tensor *wt = nb_transpose(w, 0, 1);
    nb_tensor *y = nb_matmul(x2, wt);
    nb_free(wt);
    if (x2 != x) nb_free(x2);
    if (b && y) {
        nb_tensor *yb = nb_add(y, b);
        nb_free(y);
        y = yb;
    }
    if (nd == 2 || !y) return y;
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < nd - 1; i++) shape[i] = nb_shape(x)[i];
    shape[nd - 1] = out;
    nb_tensor *v = nb_view(y, nd, shape);
    nb_free(y);
    return v;
}

nb_tensor *nb_linear(nb_tensor *x, nb_tensor *w, nb_tensor *b) {
    nn_enter();
    return nn_leave("nb_linear", linear_body(x, w, b));
}

/* U(-bound, bound) in the default dtype, registered as name */
nb_tensor *nn_uniform_param(nb_params *ps, const char *name, int ndim, const int64_t *shape,
                            double bound, nb_rng *rng) {
    nb_scope_begin();
    nb_tensor *u = nb_rand(nb_default_dtype(), ndim, shape, rng);
    nb_tensor *p = nb_params_add(ps, name, nb_add_scalar(nb_mul_scalar(u, 2 * bound), -bound));
    nb_scope_end();
    return p;
}

/* torch's default: kaiming_uniform(a = sqrt(5)) gives bound 1/sqrt(in) for
 * the weight, and the bias uses the same bound. */
static int linear_init_body(nb_Linear *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                   bool bias, nb_rng *rng) {
    if (!m || !ps) return (nn_error("nb_linear_init: module or registry is NULL"), -1);
    if (in <= 0 || out <= 0)
        return (nn_error("nb_linear_init: sizes must be positive, got in %lld, out %lld",
                         (long long)in, (long long)out), -1);
    char buf[512];
    double bound = 1.0 / sqrt((double)in);
    *m = (nb_Linear){.in_features = in, .out_features = out};
    const char *fn = "nb_linear_init";
    m->weight = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "weight"), 2,
                                 (const int64_t[]){out, in}, bound, rng);
    if (!m->weight) return -1;
    if (bias && !(m->bias = nn_uniform_param(ps, nn_join(fn, buf, sizeof buf, name, "bias"), 1,
                                             (const int64_t[]){out}, bound, rng)))
        return -1;
    return 0;
}

int nb_linear_init(nb_Linear *m, nb_params *ps, const char *name, int64_t in, int64_t out,
                   bool bias, nb_rng *rng) {
    nn_enter();
    return nn_leave_rc("nb_linear_init", linear_init_body(m, ps, name, in, out, bias, rng));
}

static nb_tensor *linear_forward_body(const nb_Linear *m, nb_tensor *x) {
    if (!m) return nn_error("nb_linear_forward: module is NULL");
    if (!nn_input("nb_linear_forward", x, 0)) return NULL;
    return nb_linear(x, m->weight, m->bias);
}

nb_tensor *nb_linear_forward(const nb_Linear *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_linear_forward", linear_forward_body(m, x));
}
