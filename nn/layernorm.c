/* layernorm.c: layer normalization over the last dim, as torch.nn.LayerNorm,
 * composed from public ops (mean, sub, mul, sqrt, div) so that its gradient
 * is autograd's: y = (x - mean) / sqrt(var + eps) * w + b, var biased. */
#include "nn_internal.h"


/* w or b: (D) and x's dtype */
static bool check_affine(const char *fn, const char *what, nb_tensor *p, nb_tensor *x, int64_t d) {
    char bp[128], bx[128];
    if (nb_ndim(p) != 1 || nb_shape(p)[0] != d)
        return nn_error("%s: %s must have shape (%lld), the last dim of input %s; got %s", fn,
                        what, (long long)d, NN_SHAPE(bx, x),
                        NN_SHAPE(bp, p)), false;
    if (nb_dtype_of(p) != nb_dtype_of(x))
        return nn_error("%s: %s is %s but input is %s", fn, what, nb_dtype_name(nb_dtype_of(p)),
                        nb_dtype_name(nb_dtype_of(x))), false;
    return true;
}

/* x (..., D), w (D) or NULL, b (D) or NULL -> (..., D) */
static nb_tensor *layer_norm_body(nb_tensor *x, nb_tensor *w, nb_tensor *b, double eps) {
    const char *fn = "nb_layer_norm";
    if (!nn_input(fn, x, 0) || !nn_opt_input(fn, w, 1) || !nn_opt_input(fn, b, 2)) return NULL;
    nb_dtype dt = nb_dtype_of(x);
    if (dt != NB_F32 && dt != NB_F64)
        return nn_error("%s: input must be floating (f32 or f64), got %s", fn, nb_dtype_name(dt));
    if (nb_ndim(x) < 1) return nn_error("%s: input must have at least 1 dim, got a 0-d tensor", fn);
    int64_t d = nb_shape(x)[nb_ndim(x) - 1];
    if (w && !check_affine(fn, "weight", w, x, d)) return NULL;
    if (b && !check_affine(fn, "bias", b, x, d)) return NULL;
    if (!(eps >= 0)) return nn_error("%s: eps must be >= 0, got %g", fn, eps);
    nb_tensor *xc = nb_sub(x, nb_mean(x, -1, true));
    nb_tensor *var = nb_mean(nb_mul(xc, xc), -1, true);
    nb_tensor *y = nb_div(xc, nb_sqrt(nb_add_scalar(var, eps)));
    if (w) y = nb_mul(y, w);
    if (b) y = nb_add(y, b);
    return y;
}

nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *w, nb_tensor *b, double eps) {
    nn_enter();
    return nn_leave("nb_layer_norm", layer_norm_body(x, w, b, eps));
}

/* weight ones, bias zeros, as torch */
static int layernorm_init_body(nb_LayerNorm *m, nb_params *ps, const char *name, int64_t dim, double eps) {
    if (!m || !ps) return (nn_error("nb_layernorm_init: module or registry is NULL"), -1);
    if (dim <= 0)
        return (nn_error("nb_layernorm_init: dim must be positive, got %lld", (long long)dim), -1);
    if (!(eps >= 0)) return (nn_error("nb_layernorm_init: eps must be >= 0, got %g", eps), -1);
    char buf[512];
    *m = (nb_LayerNorm){.dim = dim, .eps = eps};
    nb_scope_begin();
    const char *fn = "nb_layernorm_init";
    m->weight = nb_params_add(ps, nn_join(fn, buf, sizeof buf, name, "weight"),
                              nb_ones(nb_default_dtype(), 1, &dim));
    if (m->weight)
        m->bias = nb_params_add(ps, nn_join(fn, buf, sizeof buf, name, "bias"),
                                nb_zeros(nb_default_dtype(), 1, &dim));
    nb_scope_end();
    return m->weight && m->bias ? 0 : -1;
}

int nb_layernorm_init(nb_LayerNorm *m, nb_params *ps, const char *name, int64_t dim, double eps) {
    nn_enter();
    return nn_leave_rc("nb_layernorm_init", layernorm_init_body(m, ps, name, dim, eps));
}

static nb_tensor *layernorm_forward_body(const nb_LayerNorm *m, nb_tensor *x) {
    if (!m) return nn_error("nb_layernorm_forward: module is NULL");
    if (!nn_input("nb_layernorm_forward", x, 0)) return NULL;
    return nb_layer_norm(x, m->weight, m->bias, m->eps);
}

nb_tensor *nb_layernorm_forward(const nb_LayerNorm *m, nb_tensor *x) {
    nn_enter();
    return nn_leave("nb_layernorm_forward", layernorm_forward_body(m, x));
}
