/* custom_function.c: your own op with a hand-written backward, checked by
 * nb_gradcheck. The op is a fused RMSNorm, y = x / sqrt(mean(x^2) + eps) * w
 * over the last dim, written as plain C loops over nb_data, as people write
 * kernels; then the same op with one mistake in its backward, which
 * gradcheck rejects, naming the worst element.
 *
 *   build/examples/custom_function
 */
#include <math.h>
#include <stdio.h>

#include "nabla.h"

#define EPS 1e-6

/* x (R, D), w (D) -> y (R, D); saves x, w and rstd (R) = 1/sqrt(mean(x^2) + eps) */
static nb_tensor *rmsnorm_forward(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n, (void)user;
    nb_tensor *x = nb_contiguous(in[0]), *w = nb_contiguous(in[1]);
    if (!x || !w) return NULL;
    if (nb_dtype_of(x) != NB_F64 || nb_dtype_of(w) != NB_F64 || nb_ndim(x) != 2 ||
        nb_ndim(w) != 1 || nb_shape(w)[0] != nb_shape(x)[1]) {
        nb_report_error("rmsnorm: expects f64 x (R, D) and w (D)");
        return NULL;
    }
    int64_t R = nb_shape(x)[0], D = nb_shape(x)[1];
    nb_tensor *y = nb_empty(NB_F64, NB_SHAPE(R, D));
    nb_tensor *rstd = nb_empty(NB_F64, NB_SHAPE(R));
    if (!y || !rstd) return NULL;
    const double *px = nb_data(x), *pw = nb_data(w);
    double *py = nb_data(y), *pr = nb_data(rstd);
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += px[r * D + d] * px[r * D + d];
        pr[r] = 1 / sqrt(ss / (double)D + EPS);
        for (int64_t d = 0; d < D; d++) py[r * D + d] = px[r * D + d] * pr[r] * pw[d];
    }
    if (nb_function_save(ctx, x) || nb_function_save(ctx, w) || nb_function_save(ctx, rstd))
        return NULL;
    return y;
}

/* gy (R, D) -> gx (R, D), gw (D):
 *   gw[d] = sum_r gy[r,d] x[r,d] rstd[r]
 *   gx[r,d] = rstd[r] (gy[r,d] w[d]) - x[r,d] rstd[r]^3 / D * sum_e gy[r,e] w[e] x[r,e] */
static int backward_with(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, double scale) {
    nb_tensor *x = nb_function_saved(ctx, 0), *w = nb_function_saved(ctx, 1);
    nb_tensor *rstd = nb_function_saved(ctx, 2), *g = nb_contiguous(gy);
    if (!x || !w || !rstd || !g) return -1;
    int64_t R = nb_shape(x)[0], D = nb_shape(x)[1];
    nb_tensor *gx = nb_zeros(NB_F64, NB_SHAPE(R, D)), *gw = nb_zeros(NB_F64, NB_SHAPE(D));
    if (!gx || !gw) return -1;
    const double *px = nb_data(x), *pw = nb_data(w), *pr = nb_data(rstd), *pg = nb_data(g);
    double *pgx = nb_data(gx), *pgw = nb_data(gw);
    for (int64_t r = 0; r < R; r++) {
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += pg[r * D + d] * pw[d] * px[r * D + d];
        double k = pr[r] * pr[r] * pr[r] * dot * scale;
        for (int64_t d = 0; d < D; d++) {
            pgx[r * D + d] = pr[r] * pg[r * D + d] * pw[d] - px[r * D + d] * k;
            pgw[d] += pg[r * D + d] * px[r * D + d] * pr[r];
        }
    }
    if (nb_function_needs_input_grad(ctx, 0)) gin[0] = gx;
    if (nb_function_needs_input_grad(ctx, 1)) gin[1] = gw;
    return 0;
}

static int rmsnorm_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)user;
    return backward_with(ctx, gy, gin, 1.0 / (double)nb_shape(gy)[1]);
}

/* The mistake: the 1/D of the mean is forgotten in the second term. */
static int buggy_backward(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    (void)user;
    return backward_with(ctx, gy, gin, 1.0);
}

static const nb_function RMSNORM = {.name = "rmsnorm", .forward = rmsnorm_forward,
                                    .backward = rmsnorm_backward};
static const nb_function BUGGY = {.name = "rmsnorm_buggy", .forward = rmsnorm_forward,
                                  .backward = buggy_backward};

/* The function gradcheck differentiates: the op itself, its inputs as given. */
static nb_tensor *apply(nb_tensor **in, int n, void *f) {
    return nb_function_apply(f, in, n, NULL);
}

int main(void) {
    nb_rng rng;
    nb_rng_seed(&rng, 7);
    nb_tensor *x = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(4, 6), &rng), true);
    nb_tensor *w = nb_set_requires_grad(nb_randn(NB_F64, NB_SHAPE(6), &rng), true);
    nb_tensor *in[2] = {x, w};
    nb_gradcheck_result r;
    int status = 0;

    bool ok = nb_gradcheck(apply, (void *)&RMSNORM, 2, in, NULL, &r);
    printf("%s\n%s\n", ok ? "rmsnorm: backward matches finite differences" : "unexpected",
           r.message);
    if (!ok) status = 1;

    ok = nb_gradcheck(apply, (void *)&BUGGY, 2, in, NULL, &r);
    printf("%s\n%s\n", ok ? "unexpected" : "rmsnorm_buggy: gradcheck rejects its backward",
           r.message);
    if (ok) status = 1;

    /* In a graph like any op: y = rmsnorm(x, w), loss = sum(y^2). */
    nb_scope_begin();
    nb_tensor *y = nb_function_apply(&RMSNORM, in, 2, NULL);
    nb_tensor *loss = nb_sum_all(nb_mul(y, y));
    if (!loss || nb_backward(loss) != 0) {
        fprintf(stderr, "%s\n", nb_last_error());
        status = 1;
    } else {
        printf("loss = sum(rmsnorm(x, w)^2) = %.6f; dloss/dw:\n", nb_item(loss));
        nb_print(nb_grad(w));
    }
    /* f32 input: the kernel reports it, nb_function_apply names the op */
    nb_tensor *x32 = nb_to(x, NB_F32), *in32[2] = {x32, nb_to(w, NB_F32)};
    if (!nb_function_apply(&RMSNORM, in32, 2, NULL)) printf("%s\n", nb_last_error());
    nb_scope_end();
    nb_free(x);
    nb_free(w);
    return status;
}
