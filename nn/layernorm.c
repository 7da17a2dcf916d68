/* layernorm.c: layer normalization over the last dim, as torch.nn.LayerNorm:
 * y = (x - mean) / sqrt(var + eps) * w + b, var biased. A custom function
 * (nb_function) with hand-written kernels: composed from public ops it took
 * nine ops and kept five (..., D) tensors per call for backward. Those ops
 * come back only where a graph of the gradient is wanted (create_graph's
 * backward) and in the tangent rule (forward mode). */
#include <math.h>
#include <stdlib.h>

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

/* ----------------------------------------------------------- the kernels
 * Rows of x (R, D), contiguous. Statistics per row in double: mean, then the
 * biased variance from the deviations (two passes), rstd = 1/sqrt(var + eps).
 * A row of one repeated value has that value as its mean exactly (sum / D
 * may round off it, and with eps = 0 the rounding error would be scaled up
 * to outputs of +-1): its deviations are 0, and with eps = 0 the outputs
 * 0 * inf = NaN, as PyTorch's. Each row is computed alone, so the split
 * across threads changes nothing. */
typedef struct {
    double eps;
    bool has_w, has_b;
} ln_args;

typedef struct {
    const void *x, *w, *b, *dy;
    void *y, *dx;
    double *stats; /* (R, 2): mean, rstd */
    double *dw, *db; /* (D) sums over rows, in row order (backward) */
    int64_t D;
    double eps;
    bool f64;
} ln_job;

#define LN_AT(T, p, i) ((const T *)(p))[i]

/* (NN_CLONES: the kernels are compiled for AVX-512 and AVX2 too, same bits) */

/* The sums over a row are chains of dependent double additions, each one
 * waiting for the last (4 cycles or so): LN_RB rows are summed side by side,
 * each in its own chain in the same order as alone, so that the chains
 * overlap and the bits are a lone row's. n: LN_RB, or 1 for the rows left
 * over (constant at each use: the accumulators live in registers). */
#define LN_RB 8
/* the backward's sums: two chains a row, 4 rows (8 rows' 16 chains, their
 * means and rstds outnumber SSE2's 16 registers, and spilled) */
#define LN_RBB 4

/* mean and rstd of rows x, x + D, ..., n of them, into stats (2 per row) */
#define LN_STATS(T, x, n, st)                                                          \
    do {                                                                               \
        double mean_[LN_RB] = {0}, var_[LN_RB] = {0};                                  \
        T x0_[LN_RB];                                                                  \
        int flat_[LN_RB];                                                              \
        for (int q = 0; q < (n); q++) flat_[q] = 1, x0_[q] = (x)[q * D];               \
        for (int64_t i = 0; i < D; i++)                                                \
            for (int q = 0; q < (n); q++) {                                            \
                T v_ = (x)[q * D + i];                                                 \
                mean_[q] += v_;                                                        \
                flat_[q] &= v_ == x0_[q];                                              \
            }                                                                          \
        for (int q = 0; q < (n); q++)                                                  \
            mean_[q] = flat_[q] && D > 0 ? (double)(x)[q * D] : mean_[q] / (double)D;  \
        for (int64_t i = 0; i < D; i++)                                                \
            for (int q = 0; q < (n); q++) {                                            \
                double d_ = (double)(x)[q * D + i] - mean_[q];                         \
                var_[q] += d_ * d_;                                                    \
            }                                                                          \
        for (int q = 0; q < (n); q++) {                                                \
            (st)[2 * q] = mean_[q];                                                    \
            (st)[2 * q + 1] = 1.0 / sqrt(var_[q] / (double)D + j->eps);                \
        }                                                                              \
    } while (0)

#define LN_FORWARD(T)                                                                  \
    for (int64_t r = lo; r < hi;) {                                                    \
        const T *x = (const T *)j->x + r * D;                                          \
        if (hi - r >= LN_RB) LN_STATS(T, x, LN_RB, j->stats + 2 * r);                  \
        else LN_STATS(T, x, 1, j->stats + 2 * r);                                      \
        for (int64_t e = r + (hi - r >= LN_RB ? LN_RB : 1); r < e; r++, x += D) {      \
            T *y = (T *)j->y + r * D;                                                  \
            double mean = j->stats[2 * r], rstd = j->stats[2 * r + 1];                 \
            for (int64_t i = 0; i < D; i++) {                                          \
                double v = ((double)x[i] - mean) * rstd;                               \
                if (j->w) v *= LN_AT(T, j->w, i);                                      \
                if (j->b) v += LN_AT(T, j->b, i);                                      \
                y[i] = (T)v;                                                           \
            }                                                                          \
        }                                                                              \
    }

NN_CLONES static void ln_forward_rows(void *ctx, int64_t lo, int64_t hi) {
    const ln_job *j = ctx;
    int64_t D = j->D;
    if (j->f64) LN_FORWARD(double)
    else LN_FORWARD(float)
}

/* s1, s2 (n of each) of rows r.. (x and dy at row r): the sums of dxh and
 * dxh xh over each row, divided by D */
#define LN_SUMS(T, x, dy, r, n, s1, s2)                                                \
    do {                                                                               \
        double m_[LN_RBB], rs_[LN_RBB];                                                  \
        for (int q = 0; q < (n); q++) {                                                \
            m_[q] = j->stats[2 * ((r) + q)];                                           \
            rs_[q] = j->stats[2 * ((r) + q) + 1];                                      \
            (s1)[q] = (s2)[q] = 0;                                                     \
        }                                                                              \
        for (int64_t i = 0; i < D; i++)                                                \
            for (int q = 0; q < (n); q++) {                                            \
                double dxh = j->w ? (double)(dy)[q * D + i] * LN_AT(T, j->w, i)        \
                                  : (double)(dy)[q * D + i];                           \
                (s1)[q] += dxh;                                                        \
                (s2)[q] += dxh * (((double)(x)[q * D + i] - m_[q]) * rs_[q]);          \
            }                                                                          \
        for (int q = 0; q < (n); q++) {                                                \
            (s1)[q] /= (double)D;                                                      \
            (s2)[q] /= (double)D;                                                      \
        }                                                                              \
    } while (0)

/* dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)), dxh = dy w, xh = (x - mean) rstd */
#define LN_BACKWARD_DX(T)                                                              \
    for (int64_t r = lo; r < hi;) {                                                    \
        const T *x = (const T *)j->x + r * D, *dy = (const T *)j->dy + r * D;          \
        double s1s[LN_RBB], s2s[LN_RBB];                                               \
        const int n = hi - r >= LN_RBB ? LN_RBB : 1;                                   \
        if (n == LN_RBB) LN_SUMS(T, x, dy, r, LN_RBB, s1s, s2s);                       \
        else LN_SUMS(T, x, dy, r, 1, s1s, s2s);                                        \
        for (int q = 0; q < n; q++, r++, x += D, dy += D) {                            \
            T *dx = (T *)j->dx + r * D;                                                \
            double mean = j->stats[2 * r], rstd = j->stats[2 * r + 1];                 \
            double s1 = s1s[q], s2 = s2s[q];                                           \
            for (int64_t i = 0; i < D; i++) {                                          \
                double dxh = j->w ? (double)dy[i] * LN_AT(T, j->w, i) : (double)dy[i]; \
                double xh = ((double)x[i] - mean) * rstd;                              \
                dx[i] = (T)(rstd * (dxh - s1 - xh * s2));                              \
            }                                                                          \
        }                                                                              \
    }

NN_CLONES static void ln_backward_rows(void *ctx, int64_t lo, int64_t hi) {
    const ln_job *j = ctx;
    int64_t D = j->D;
    if (j->f64) LN_BACKWARD_DX(double)
    else LN_BACKWARD_DX(float)
}

/* dw[c] = sum over rows of dy xh, db[c] = sum of dy, for columns [lo, hi):
 * each column summed over the rows in order, whoever computes it. */
#define LN_BACKWARD_DWB(T)                                                             \
    for (int64_t r = 0; r < R; r++) {                                                  \
        const T *x = (const T *)j->x + r * D, *dy = (const T *)j->dy + r * D;          \
        double mean = j->stats[2 * r], rstd = j->stats[2 * r + 1];                     \
        for (int64_t c = lo; c < hi; c++) {                                            \
            if (j->dw) j->dw[c] += (double)dy[c] * (((double)x[c] - mean) * rstd);     \
            if (j->db) j->db[c] += (double)dy[c];                                      \
        }                                                                              \
    }

typedef struct {
    const ln_job *j;
    int64_t R;
} ln_cols;

NN_CLONES static void ln_backward_cols(void *ctx, int64_t lo, int64_t hi) {
    const ln_cols *c = ctx;
    const ln_job *j = c->j;
    int64_t R = c->R, D = j->D;
    if (j->f64) LN_BACKWARD_DWB(double)
    else LN_BACKWARD_DWB(float)
}

/* --------------------------------------------------- the composed form
 * Public ops on tensors with their history: differentiable again. */

/* x (..., D) -> xh = (x - mean) * rstd (..., D), rstd (..., 1). The mean is
 * taken of the deviations from each row's first value (mean(x) =
 * x0 + mean(x - x0)), so a row of one value gives xh = 0 * rstd, as the
 * kernel does. */
static nb_tensor *ln_normalized(nb_tensor *x, double eps, nb_tensor **rstd) {
    nb_tensor *d = nb_sub(x, nb_narrow(x, -1, 0, 1));
    nb_tensor *xc = nb_sub(d, nb_mean(d, -1, true));
    *rstd = nb_pow_scalar(nb_add_scalar(nb_mean(nb_mul(xc, xc), -1, true), eps), -0.5);
    return nb_mul(xc, *rstd);
}

/* v (..., D) -> J v, J = d xh / dx = rstd (I - 1/D - xh xh^T / D), which is
 * symmetric: the input's gradient (v = dy w) and its tangent (v = dx). */
static nb_tensor *ln_through_normalize(nb_tensor *v, nb_tensor *xh, nb_tensor *rstd) {
    nb_tensor *c = nb_sub(v, nb_mean(v, -1, true));
    return nb_mul(rstd, nb_sub(c, nb_mul(xh, nb_mean(nb_mul(v, xh), -1, true))));
}

/* t (..., D) -> (D): the sum over every row */
static nb_tensor *ln_sum_rows(nb_tensor *t) {
    int dims[NB_MAX_DIMS], nd = nb_ndim(t) - 1;
    for (int i = 0; i < nd; i++) dims[i] = i;
    return nd ? nb_sum_dims(t, nd, dims, false) : t;
}

/* ------------------------------------------------------- the custom function
 * inputs: x, then w and b when present; saves x and w (the inputs, which
 * come back with their history when the gradient is recorded) and the
 * statistics (R, 2) f64 the kernels read. */
static nb_tensor *ln_fwd(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n;
    const ln_args *a = user;
    nb_tensor *x = nb_contiguous(in[0]);
    nb_tensor *w = a->has_w ? in[1] : NULL, *b = a->has_b ? in[a->has_w ? 2 : 1] : NULL;
    int64_t D = nb_shape(x)[nb_ndim(x) - 1], R = D ? nb_numel(x) / D : 0;
    nb_tensor *y = nb_empty(nb_dtype_of(x), nb_ndim(x), nb_shape(x));
    nb_tensor *stats = nb_empty(NB_F64, NB_SHAPE(R, 2));
    nb_tensor *wc = w ? nb_contiguous(w) : NULL, *bc = b ? nb_contiguous(b) : NULL;
    if (!x || !y || !stats || (w && !wc) || (b && !bc)) return NULL;
    ln_job j = {.x = nb_data(x), .w = wc ? nb_data(wc) : NULL, .b = bc ? nb_data(bc) : NULL,
                .y = nb_data(y), .stats = nb_data(stats), .D = D, .eps = a->eps,
                .f64 = nb_dtype_of(x) == NB_F64};
    nb_parallel_for(R, nn_rows_grain(D), ln_forward_rows, &j);
    if (nb_function_save(ctx, in[0]) || nb_function_save(ctx, stats) ||
        (w && nb_function_save(ctx, w)))
        return NULL;
    return y;
}

/* The backward as recorded ops (create_graph):
 *   dx = J (dy w), dw = sum over rows of dy xh, db = sum over rows of dy */
static int ln_bwd_graph(nb_function_ctx *ctx, const ln_args *a, nb_tensor *gy, nb_tensor **gin) {
    nb_tensor *x = nb_function_saved(ctx, 0), *w = a->has_w ? nb_function_saved(ctx, 2) : NULL;
    int iw = 1, ib = a->has_w ? 2 : 1;
    bool want_x = nb_function_needs_input_grad(ctx, 0);
    bool want_w = a->has_w && nb_function_needs_input_grad(ctx, iw);
    bool want_b = a->has_b && nb_function_needs_input_grad(ctx, ib);
    if (!x || (a->has_w && !w)) return -1;
    if (nb_numel(x) == 0) { /* no rows, or rows of nothing: zero gradients */
        if (want_x) gin[0] = nb_zeros(nb_dtype_of(x), nb_ndim(x), nb_shape(x));
        if (want_w) gin[iw] = nb_zeros(nb_dtype_of(w), 1, nb_shape(w));
        if (want_b) gin[ib] = nb_zeros(nb_dtype_of(x), 1, nb_shape(x) + nb_ndim(x) - 1);
    } else {
        nb_tensor *rstd, *xh = ln_normalized(x, a->eps, &rstd);
        if (want_x) gin[0] = ln_through_normalize(w ? nb_mul(gy, w) : gy, xh, rstd);
        if (want_w) gin[iw] = ln_sum_rows(nb_mul(gy, xh));
        if (want_b) gin[ib] = ln_sum_rows(gy);
    }
    return (want_x && !gin[0]) || (want_w && !gin[iw]) || (want_b && !gin[ib]) ? -1 : 0;
}

static int ln_bwd(nb_function_ctx *ctx, nb_tensor *gy, nb_tensor **gin, void *user) {
    const ln_args *a = user;
    if (nb_grad_enabled()) return ln_bwd_graph(ctx, a, gy, gin);
    nb_tensor *x = nb_function_saved(ctx, 0), *stats = nb_function_saved(ctx, 1);
    nb_tensor *w = a->has_w ? nb_function_saved(ctx, 2) : NULL;
    if (!x || !stats || (a->has_w && !w)) return -1;
    x = nb_contiguous(x);
    w = w ? nb_contiguous(w) : NULL;
    nb_tensor *dy = nb_contiguous(gy);
    if (!x || (a->has_w && !w) || !dy) return -1;
    int64_t D = nb_shape(x)[nb_ndim(x) - 1], R = D ? nb_numel(x) / D : 0;
    nb_dtype dt = nb_dtype_of(x);
    ln_job j = {.x = nb_data(x), .w = w ? nb_data(w) : NULL, .dy = nb_data(dy),
                .stats = nb_data(stats), .D = D, .f64 = dt == NB_F64};
    if (nb_function_needs_input_grad(ctx, 0)) {
        if (!(gin[0] = nb_empty(dt, nb_ndim(x), nb_shape(x)))) return -1;
        j.dx = nb_data(gin[0]);
        nb_parallel_for(R, nn_rows_grain(D), ln_backward_rows, &j);
    }
    int iw = 1, ib = a->has_w ? 2 : 1;
    bool want_w = a->has_w && nb_function_needs_input_grad(ctx, iw);
    bool want_b = a->has_b && nb_function_needs_input_grad(ctx, ib);
    if (!want_w && !want_b) return 0;
    nb_tensor *sums = nb_zeros(NB_F64, NB_SHAPE(2, D));
    if (!sums) return -1;
    j.dw = want_w ? nb_data(sums) : NULL;
    j.db = want_b ? (double *)nb_data(sums) + D : NULL;
    ln_cols c = {.j = &j, .R = R};
    int64_t cols = R > 0 && 16384 / R > 16 ? 16384 / R : 16; /* ~16K elements a task */
    nb_parallel_for(D, cols, ln_backward_cols, &c);
    if (want_w && !(gin[iw] = nb_to(nb_select(sums, 0, 0), dt))) return -1;
    if (want_b && !(gin[ib] = nb_to(nb_select(sums, 0, 1), dt))) return -1;
    return 0;
}

/* a + b, where NULL is zero */
static nb_tensor *ln_plus(nb_tensor *a, nb_tensor *b) { return a ? nb_add(a, b) : b; }

/* Forward mode: dy = (J dx) w + xh dw + db (a NULL tangent is zero). */
static nb_tensor *ln_jvp(nb_function_ctx *ctx, nb_tensor **tin, int n, void *user) {
    (void)n;
    const ln_args *a = user;
    nb_tensor *x = nb_function_saved(ctx, 0), *w = a->has_w ? nb_function_saved(ctx, 2) : NULL;
    if (!x || (a->has_w && !w)) return NULL;
    nb_tensor *tx = tin[0], *tw = a->has_w ? tin[1] : NULL;
    nb_tensor *tb = a->has_b ? tin[a->has_w ? 2 : 1] : NULL;
    nb_tensor *t = NULL;
    if ((tx || tw) && nb_numel(x) > 0) {
        nb_tensor *rstd, *xh = ln_normalized(x, a->eps, &rstd);
        if (tx) t = ln_through_normalize(tx, xh, rstd);
        if (tx && w) t = nb_mul(t, w);
        if (tw) t = ln_plus(t, nb_mul(xh, tw));
    }
    if (tb) t = ln_plus(t, tb);
    if (t && nb_ndim(t) == nb_ndim(x)) return t;
    /* no tangent, or db alone: to x's shape */
    return ln_plus(t, nb_zeros(nb_dtype_of(x), nb_ndim(x), nb_shape(x)));
}

static const nb_function layer_norm_fn = {.name = "nb_layer_norm", .forward = ln_fwd,
                                          .backward = ln_bwd, .destroy = free, .jvp = ln_jvp};

/* x (..., D), w (D) or NULL, b (D) or NULL -> (..., D): one op with its own
 * backward (a custom function: nn/ sees only nabla.h), so a call costs two
 * passes over x forward and three backward, and the graph keeps x and the
 * row statistics only. */
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
    ln_args *a = malloc(sizeof *a);
    if (!a) return nn_error("%s: out of memory", fn);
    *a = (ln_args){.eps = eps, .has_w = w != NULL, .has_b = b != NULL};
    nb_tensor *in[3] = {x, w ? w : b, w ? b : NULL};
    return nb_function_apply(&layer_norm_fn, in, 1 + (w != NULL) + (b != NULL), a);
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
