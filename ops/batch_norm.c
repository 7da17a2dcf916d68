/* batch_norm.c: nb_batch_norm, torch.nn.functional.batch_norm.
 *
 * The input (N, C, ...) is read as (N, C, R), R the product of the trailing
 * dims (1 for (N, C)); statistics are per channel over N * R = M values.
 *
 * Training: the batch's mean and biased variance, in one pass over the input:
 * each (n, c) row of R contiguous values (in cache) gives its own mean and
 * sum of squared deviations (8 interleaved partial sums, vectorized),
 * merged into the channel's by Chan's formula, in double. A channel is reduced by one thread, rows in order, so the bits do
 * not depend on the thread count. The running statistics, when given, are
 * updated in place once per call (never by backward or forward mode):
 * r = (1 - momentum) r + momentum s, with the unbiased variance.
 * Eval: the running statistics.
 *
 * The node keeps (2, C) doubles, mean and 1/sqrt(var + eps) as the forward
 * used them (node->extra), and the input and weight. The output is
 * x a + (b - mean a), a = invstd w, as torch orders it. The backward is fused
 * (one pass for the channel sums, one for dx), in torch's order:
 *   dx = w invstd (g - mean(g) - xhat mean(g xhat))  (training)
 *   dx = w invstd g                                  (eval)
 *   dw = sum(g xhat), db = sum(g)
 * f32 statistics and sums accumulate in double (docs/numerics.md).
 * and the same made of recorded ops under create_graph. */
#include "ops_internal.h"

#include <math.h>

/* ------------------------------------------------------------ geometry */
typedef struct {
    int64_t n, c, r; /* (N, C, R) */
} bn_dims;

static bn_dims dims_of(const nb_tensor *x) {
    bn_dims d = {x->shape[0], x->shape[1], 1};
    for (int k = 2; k < x->ndim; k++) d.r *= x->shape[k];
    return d;
}

/* t itself when contiguous, else a contiguous copy (recorded nothing) */
static nb_tensor *dense(const char *fn, nb_tensor *t) {
    if (nb_is_contiguous(t)) return t;
    nb_tensor *c = nbi_new(fn, t->dtype, t->ndim, t->shape, false);
    if (c) nbi_copy_strided(c, t->strides, t);
    return c;
}

static double at(const nb_tensor *t, int64_t i) {
    const char *p = nbi_ptr(t);
    return t->dtype == NB_F32 ? ((const float *)p)[i * t->strides[0]]
                              : ((const double *)p)[i * t->strides[0]];
}

/* ------------------------------------------------------- forward kernels */
/* Sums of a row in double, in 8 interleaved partial sums added at the end: a
 * fixed order (the same bits wherever the row sits and whichever thread
 * takes it) that the compiler can vectorize, where one running sum would be
 * a chain of dependent adds. */
#define NB_LANES 8
#define ROW_SUMS(NAME, T)                                                          \
    /* sum(x), and sum((x - m)^2) */                                               \
    static double NAME##_sum(const T *x, int64_t n) {                              \
        double acc[NB_LANES] = {0};                                                \
        int64_t i = 0;                                                             \
        for (; i + NB_LANES <= n; i += NB_LANES)                                   \
            for (int l = 0; l < NB_LANES; l++) acc[l] += x[i + l];                 \
        for (int l = 0; i < n; i++, l++) acc[l] += x[i];                           \
        return lanes_total(acc);                                                   \
    }                                                                              \
    static double NAME##_sqdev(const T *x, int64_t n, double m) {                  \
        double acc[NB_LANES] = {0};                                                \
        int64_t i = 0;                                                             \
        for (; i + NB_LANES <= n; i += NB_LANES)                                   \
            for (int l = 0; l < NB_LANES; l++) {                                   \
                double d = (double)x[i + l] - m;                                   \
                acc[l] += d * d;                                                   \
            }                                                                      \
        for (int l = 0; i < n; i++, l++) {                                         \
            double d = (double)x[i] - m;                                           \
            acc[l] += d * d;                                                       \
        }                                                                          \
        return lanes_total(acc);                                                   \
    }                                                                              \
    /* sum(g) into *sg, sum(g (x - m)) into *dot */                                \
    static void NAME##_gdot(const T *g, const T *x, int64_t n, double m, double *sg, \
                            double *dot) {                                         \
        double a[NB_LANES] = {0}, b[NB_LANES] = {0};                               \
        int64_t i = 0;                                                             \
        for (; i + NB_LANES <= n; i += NB_LANES)                                   \
            for (int l = 0; l < NB_LANES; l++) {                                   \
                a[l] += g[i + l];                                                  \
                b[l] += (double)g[i + l] * ((double)x[i + l] - m);                 \
            }                                                                      \
        for (int l = 0; i < n; i++, l++) {                                         \
            a[l] += g[i];                                                          \
            b[l] += (double)g[i] * ((double)x[i] - m);                             \
        }                                                                          \
        *sg += lanes_total(a);                                                     \
        *dot += lanes_total(b);                                                    \
    }

static double lanes_total(const double *acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
ROW_SUMS(f32, float)
ROW_SUMS(f64, double)

/* x (N,C,R) contiguous -> st (2,C): the batch mean and biased variance */
typedef struct {
    const nb_tensor *x;
    bn_dims d;
    double *mean, *var;
} stats_job;

#define ROW_STATS(T, NAME)                                                        \
    for (int64_t n = 0; n < j->d.n; n++) {                                        \
        const T *row = (const T *)nbi_ptr(j->x) + (n * j->d.c + c) * r;           \
        double rm = NAME##_sum(row, r) / (double)r, m2 = NAME##_sqdev(row, r, rm); \
        /* Chan et al.: merge (cnt, mean, M2) with (r, rm, m2) */                 \
        double tot = cnt + (double)r, delta = rm - mean;                          \
        mean += delta * ((double)r / tot);                                        \
        M2 += m2 + delta * delta * (cnt * (double)r / tot);                       \
        cnt = tot;                                                                \
    }

static void stats_span(void *ctx, int64_t lo, int64_t hi) {
    const stats_job *j = ctx;
    int64_t r = j->d.r;
    for (int64_t c = lo; c < hi; c++) {
        double cnt = 0, mean = 0, M2 = 0;
        if (j->x->dtype == NB_F32) ROW_STATS(float, f32)
        else ROW_STATS(double, f64)
        j->mean[c] = mean;
        j->var[c] = M2 / cnt;
    }
}

/* x (N,C,R) contiguous, st (2,C) mean and invstd -> y (N,C,R):
 * y = x a + b', a = invstd w, b' = b - mean a (torch's order), in double,
 * rounded once */
typedef struct {
    const nb_tensor *x, *w, *b;
    nb_tensor *y;
    bn_dims d;
    const double *mean, *invstd;
} norm_job;

#define NORM_ROWS(T)                                                              \
    for (int64_t k = lo; k < hi; k++) {                                           \
        int64_t c = k % j->d.c;                                                   \
        double a = j->invstd[c] * (j->w ? at(j->w, c) : 1.0);                     \
        double sh = (j->b ? at(j->b, c) : 0.0) - j->mean[c] * a;                  \
        const T *xr = (const T *)nbi_ptr(j->x) + k * j->d.r;                      \
        T *yr = (T *)nbi_ptr(j->y) + k * j->d.r;                                  \
        for (int64_t i = 0; i < j->d.r; i++) yr[i] = (T)((double)xr[i] * a + sh); \
    }

static void norm_span(void *ctx, int64_t lo, int64_t hi) {
    const norm_job *j = ctx;
    if (j->x->dtype == NB_F32) NORM_ROWS(float)
    else NORM_ROWS(double)
}

/* ------------------------------------------------------ backward kernels */
/* g, x (N,C,R) contiguous -> per channel sum(g) and dot = sum(g (x - mean)) */
typedef struct {
    const nb_tensor *g, *x;
    bn_dims d;
    const double *mean;
    double *sg, *dot;
} gsum_job;

#define GSUM(T, NAME)                                                             \
    for (int64_t n = 0; n < j->d.n; n++) {                                        \
        const T *gr = (const T *)nbi_ptr(j->g) + (n * j->d.c + c) * j->d.r;       \
        const T *xr = (const T *)nbi_ptr(j->x) + (n * j->d.c + c) * j->d.r;       \
        NAME##_gdot(gr, xr, j->d.r, m, &sg, &dot);                                \
    }

static void gsum_span(void *ctx, int64_t lo, int64_t hi) {
    const gsum_job *j = ctx;
    for (int64_t c = lo; c < hi; c++) {
        double sg = 0, dot = 0, m = j->mean[c];
        if (j->g->dtype == NB_F32) GSUM(float, f32)
        else GSUM(double, f64)
        j->sg[c] = sg;
        j->dot[c] = dot;
    }
}

/* torch's order: dx = (g - sg/M - (x - mean) invstd^2 dot/M) invstd w
 * (training), g invstd w (eval) */
typedef struct {
    const nb_tensor *g, *x, *w;
    nb_tensor *dx;
    bn_dims d;
    bool training;
    const double *mean, *invstd, *sg, *dot;
} dx_job;

#define DX_ROWS(T)                                                                \
    for (int64_t k = lo; k < hi; k++) {                                           \
        int64_t c = k % j->d.c;                                                   \
        double is = j->invstd[c], m = j->mean[c], M = (double)(j->d.n * j->d.r);   \
        double sc = is * (j->w ? at(j->w, c) : 1.0);                              \
        double mg = j->training ? j->sg[c] / M : 0;                               \
        double proj = j->training ? j->dot[c] / M * is * is : 0;                  \
        const T *gr = (const T *)nbi_ptr(j->g) + k * j->d.r;                      \
        const T *xr = (const T *)nbi_ptr(j->x) + k * j->d.r;                      \
        T *o = (T *)nbi_ptr(j->dx) + k * j->d.r;                                  \
        if (j->training)                                                          \
            for (int64_t i = 0; i < j->d.r; i++)                                  \
                o[i] = (T)(((double)gr[i] - mg - ((double)xr[i] - m) * proj) * sc); \
        else                                                                      \
            for (int64_t i = 0; i < j->d.r; i++) o[i] = (T)((double)gr[i] * sc);  \
    }

static void dx_span(void *ctx, int64_t lo, int64_t hi) {
    const dx_job *j = ctx;
    if (j->g->dtype == NB_F32) DX_ROWS(float)
    else DX_ROWS(double)
}

/* grain: rows of R values (R may be 0: an empty trailing dim); a channel is
 * one unit of the stats passes */
static int64_t row_grain(int64_t r) { return r >= NBI_GRAIN ? 1 : NBI_GRAIN / (r ? r : 1); }

/* ---------------------------------------------------- the node's layout
 * in: x, then weight and bias when given (n->i[0], n->i[1]: their
 * positions, -1 when NULL); d[0] training, d[1] eps; extra (2, C) f64:
 * mean, invstd. */
static nb_tensor *node_w(const nbi_node *n) {
    return n->i[0] >= 0 ? nbi_saved_in(n, (int)n->i[0]) : NULL;
}

/* (1, C, 1, ...) of x's ndim: how a per-channel (C) tensor broadcasts */
static nb_tensor *per_channel(nb_tensor *v, int ndim) {
    int64_t sh[NB_MAX_DIMS];
    for (int k = 0; k < ndim; k++) sh[k] = 1;
    sh[1] = v ? v->shape[0] : 1;
    return v ? nb_reshape(v, ndim, sh) : NULL;
}

/* the reduced dims: all but 1 */
static int other_dims(int ndim, int *dims) {
    int k = 0;
    for (int d = 0; d < ndim; d++)
        if (d != 1) dims[k++] = d;
    return k;
}

/* Recorded ops (create_graph and forward mode): xhat of x, with invstd
 * (1,C,1..) out; training recomputes the statistics from x. */
static nb_tensor *recorded_xhat(const nbi_node *n, nb_tensor *x, nb_tensor **invstd) {
    int dims[NB_MAX_DIMS], nd = other_dims(x->ndim, dims);
    if (n->d[0] != 0) {
        nb_tensor *xc = nb_sub(x, nb_mean_dims(x, nd, dims, true));
        nb_tensor *var = nb_mean_dims(nb_mul(xc, xc), nd, dims, true);
        *invstd = nb_pow_scalar(nb_add_scalar(var, n->d[1]), -0.5);
        return nb_mul(xc, *invstd);
    }
    nb_tensor *st = nb_to(n->extra, x->dtype);
    nb_tensor *mean = per_channel(nb_select(st, 0, 0), x->ndim);
    *invstd = per_channel(nb_select(st, 0, 1), x->ndim);
    return nb_mul(nb_sub(x, mean), *invstd);
}

/* u - mean(u) - xhat mean(u xhat) over the reduced dims */
static nb_tensor *project(nb_tensor *u, nb_tensor *xhat) {
    int dims[NB_MAX_DIMS], nd = other_dims(u->ndim, dims);
    nb_tensor *a = nb_sub(u, nb_mean_dims(u, nd, dims, true));
    return nb_sub(a, nb_mul(xhat, nb_mean_dims(nb_mul(u, xhat), nd, dims, true)));
}

static int backward_recorded(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = nbi_saved_in(n, 0), *w = node_w(n), *invstd = NULL;
    nb_tensor *xhat = recorded_xhat(n, x, &invstd);
    if (!xhat) return -1;
    int dims[NB_MAX_DIMS], nd = other_dims(x->ndim, dims);
    nb_tensor *scale = w ? nb_mul(invstd, per_channel(w, x->ndim)) : invstd;
    if (nbi_wants(n, 0)) {
        gin[0] = nb_mul(scale, n->d[0] != 0 ? project(g, xhat) : g);
        if (!gin[0]) return -1;
    }
    if (n->i[0] >= 0 && nbi_wants(n, (int)n->i[0]) &&
        !(gin[n->i[0]] = nb_sum_dims(nb_mul(g, xhat), nd, dims, false)))
        return -1;
    if (n->i[1] >= 0 && nbi_wants(n, (int)n->i[1]) &&
        !(gin[n->i[1]] = nb_sum_dims(g, nd, dims, false)))
        return -1;
    return 0;
}

static int batch_norm_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const char *fn = "nb_batch_norm";
    if (nbi_create_graph()) return backward_recorded(n, g, gin);
    nb_tensor *x = nbi_saved_in(n, 0), *w = node_w(n);
    if (!x || (n->i[0] >= 0 && !w)) return -1;
    bn_dims d = dims_of(x);
    nb_tensor *gc = dense(fn, g);
    x = gc ? dense(fn, x) : NULL; /* (temporaries die with the rule's scope) */
    nb_tensor *sums = x ? nbi_new(fn, NB_F64, NB_SHAPE(2, d.c), false) : NULL;
    if (!sums) return -1;
    const double *st = nbi_ptr(n->extra);
    double *sg = nbi_ptr(sums), *dot = sg + d.c;
    gsum_job gj = {.g = gc, .x = x, .d = d, .mean = st, .sg = sg, .dot = dot};
    nbi_parallel_for(d.c, 1, gsum_span, &gj);
    if (nbi_wants(n, 0)) {
        nb_tensor *dx = nbi_new(fn, x->dtype, x->ndim, x->shape, false);
        if (!dx) return -1;
        dx_job dj = {.g = gc, .x = x, .w = w, .dx = dx, .d = d, .training = n->d[0] != 0,
                     .mean = st, .invstd = st + d.c, .sg = sg, .dot = dot};
        nbi_parallel_for(d.n * d.c, row_grain(d.r), dx_span, &dj);
        gin[0] = dx;
    }
    for (int64_t c = 0; c < d.c; c++) dot[c] *= st[d.c + c]; /* dw = dot invstd */
    for (int k = 0; k < 2; k++) { /* dw, db = sum(g) */
        if (n->i[k] < 0 || !nbi_wants(n, (int)n->i[k])) continue;
        nb_tensor *v = nb_to(nb_select(sums, 0, 1 - k), x->dtype);
        if (!v) return -1;
        gin[n->i[k]] = v;
    }
    return 0;
}

/* ty = w invstd P(tx) + tw xhat + tb, P the projection of training (identity in eval) */
static nb_tensor *batch_norm_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *x = nbi_saved_in(n, 0), *w = node_w(n), *invstd = NULL;
    nb_tensor *xhat = recorded_xhat(n, x, &invstd);
    if (!xhat) return NULL;
    nb_tensor *ty = nbi_zero_tangent(n);
    if (tin[0]) {
        nb_tensor *scale = w ? nb_mul(invstd, per_channel(w, x->ndim)) : invstd;
        ty = nb_add(ty, nb_mul(scale, n->d[0] != 0 ? project(tin[0], xhat) : tin[0]));
    }
    if (n->i[0] >= 0 && tin[n->i[0]])
        ty = nb_add(ty, nb_mul(xhat, per_channel(tin[n->i[0]], x->ndim)));
    if (n->i[1] >= 0 && tin[n->i[1]]) ty = nb_add(ty, per_channel(tin[n->i[1]], x->ndim));
    return ty;
}

/* -------------------------------------------------------------- checks */
/* v NULL, or (C) of x's dtype; what names it */
static bool check_vec(const char *fn, const char *what, const nb_tensor *v, int i,
                      const nb_tensor *x) {
    if (!v) return true;
    if (!nbi_arg(fn, v, i)) return false;
    if (v->ndim != 1 || v->shape[0] != x->shape[1]) {
        nbi_error("%s: %s must have shape (%lld) (input's channels), got %s", fn, what,
                  (long long)x->shape[1], NBI_SHAPE(v));
        return false;
    }
    if (v->dtype != x->dtype) {
        nbi_error("%s: %s is %s, input %s", fn, what, nb_dtype_name(v->dtype),
                  nb_dtype_name(x->dtype));
        return false;
    }
    return true;
}

/* Training writes the running statistics in place: each must be a tensor
 * whose elements are distinct memory, apart from each other and from what
 * the call reads (an expanded view would take the C updates one after
 * another in one element; a statistic inside the input would change it). */
static bool check_running(const char *fn, nb_tensor *rm, nb_tensor *rv, nb_tensor *x,
                          nb_tensor *w, nb_tensor *b) {
    if (!nbi_check_writable(fn, "running_mean", rm) || !nbi_check_writable(fn, "running_var", rv))
        return false;
    if (nbi_overlap(rm, rv)) {
        nbi_error("%s: running_mean and running_var share memory; training writes both: pass "
                  "two separate tensors", fn);
        return false;
    }
    const nb_tensor *read[3] = {x, w, b};
    const char *names[3] = {"input", "weight", "bias"};
    for (int k = 0; k < 3; k++) {
        if (!read[k]) continue;
        if (nbi_overlap(rm, read[k]))
            return nbi_error("%s: running_mean shares memory with %s; training writes it: pass "
                             "a separate tensor", fn, names[k]), false;
        if (nbi_overlap(rv, read[k]))
            return nbi_error("%s: running_var shares memory with %s; training writes it: pass "
                             "a separate tensor", fn, names[k]), false;
    }
    return true;
}

static bool check_args(const char *fn, nb_tensor *input, nb_tensor *rm, nb_tensor *rv,
                       nb_tensor *w, nb_tensor *b, bool training, double momentum, double eps) {
    if (!nbi_arg(fn, input, 0) || !nbi_check_float(fn, input)) return false;
    if (input->ndim < 2) {
        nbi_error("%s: input must be (N, C, ...) with at least 2 dims, got shape %s", fn,
                  NBI_SHAPE(input));
        return false;
    }
    if (!check_vec(fn, "running_mean", rm, 1, input) || !check_vec(fn, "running_var", rv, 2, input) ||
        !check_vec(fn, "weight", w, 3, input) || !check_vec(fn, "bias", b, 4, input))
        return false;
    if (!rm != !rv) {
        nbi_error("%s: running_mean and running_var go together (one of them is NULL)", fn);
        return false;
    }
    if (!training && !rm) {
        nbi_error("%s: eval mode (training false) needs running_mean and running_var", fn);
        return false;
    }
    if (!(eps >= 0) || isinf(eps)) {
        nbi_error("%s: eps must be finite and >= 0, got %g", fn, eps);
        return false;
    }
    if (training && rm && !isfinite(momentum)) {
        nbi_error("%s: momentum must be finite, got %g", fn, momentum);
        return false;
    }
    bn_dims d = dims_of(input);
    if (training && d.n * d.r == 1) {
        nbi_error("%s: training needs more than 1 value per channel, got input shape %s", fn,
                  NBI_SHAPE(input));
        return false;
    }
    return !training || !rm || check_running(fn, rm, rv, input, w, b);
}

/* r = (1 - momentum) r + momentum s, in place, once per forward */
static void update_running(nb_tensor *r, const double *s, double scale, double momentum) {
    for (int64_t c = 0; c < r->shape[0]; c++) {
        double v = (1 - momentum) * at(r, c) + momentum * s[c] * scale;
        char *p = (char *)nbi_ptr(r);
        if (r->dtype == NB_F32) ((float *)p)[c * r->strides[0]] = (float)v;
        else ((double *)p)[c * r->strides[0]] = v;
    }
    r->storage->version++;
}

/* -------------------------------------------------------------- forward */
nb_tensor *nb_batch_norm(nb_tensor *input, nb_tensor *running_mean, nb_tensor *running_var,
                         nb_tensor *weight, nb_tensor *bias, bool training, double momentum,
                         double eps) {
    const char *fn = "nb_batch_norm";
    if (!check_args(fn, input, running_mean, running_var, weight, bias, training, momentum, eps))
        return NULL;
    bn_dims d = dims_of(input);
    nb_tensor *x = dense(fn, input);
    nb_tensor *st = x ? nbi_new(fn, NB_F64, NB_SHAPE(2, d.c), false) : NULL;
    nb_tensor *y = st ? nbi_new(fn, input->dtype, input->ndim, input->shape, false) : NULL;
    if (!y) {
        nb_free(st);
        if (x != input) nb_free(x);
        return NULL;
    }
    double *mean = nbi_ptr(st), *invstd = mean + d.c;
    bool empty = d.n * d.r == 0; /* as torch: an empty output, the running stats kept */
    if (training && empty) {
        for (int64_t c = 0; c < 2 * d.c; c++) mean[c] = 0; /* no NaN into backward's sums */
    } else if (training) {
        stats_job sj = {.x = x, .d = d, .mean = mean, .var = invstd};
        nbi_parallel_for(d.c, 1, stats_span, &sj);
        if (running_mean) {
            double m = (double)(d.n * d.r);
            update_running(running_mean, mean, 1.0, momentum);
            update_running(running_var, invstd, m / (m - 1), momentum);
        }
    } else {
        for (int64_t c = 0; c < d.c; c++) {
            mean[c] = at(running_mean, c);
            invstd[c] = at(running_var, c);
        }
    }
    if (!(training && empty))
        for (int64_t c = 0; c < d.c; c++) invstd[c] = 1 / sqrt(invstd[c] + eps);
    norm_job nj = {.x = x, .w = weight, .b = bias, .y = y, .d = d, .mean = mean, .invstd = invstd};
    nbi_parallel_for(d.n * d.c, row_grain(d.r), norm_span, &nj);
    if (x != input) nb_free(x);

    nb_tensor *ins[3] = {input};
    int nin = 1;
    int64_t wi = weight ? nin : -1;
    if (weight) ins[nin++] = weight;
    int64_t bi = bias ? nin : -1;
    if (bias) ins[nin++] = bias;
    if (!nbi_needs_grad(nin, ins)) {
        nb_free(st);
        return y;
    }
    nbi_node *n = nbi_record(y, fn, batch_norm_backward, nin, ins);
    if (!n) {
        nb_free(st);
        return nbi_discard(y);
    }
    nbi_save(n, NBI_SAVE_IN(0) | (weight ? NBI_SAVE_IN(wi) : 0));
    n->i[0] = wi;
    n->i[1] = bi;
    n->d[0] = training;
    n->d[1] = eps;
    n->extra = nbi_unscoped(st);
    n->jvp = batch_norm_jvp;
    return y;
}
