/* reduce.c: sums, means and maxima over one dim or over everything, their
 * backward rules (made of recorded ops under create_graph) and tangent
 * rules, and nbi_sum_to, which undoes broadcasting in backward. */
#include "index_internal.h"

#include <math.h>
#include <string.h>

/* A reduction of t over dim d: out has t's shape with d removed (or kept as
 * 1). The walk visits every output element once (o = its offset, x = offset
 * of its first input element); the reduced elements are x + r * rstride. */
typedef struct {
    nbi_iter it;
    int64_t len, rstride;
} reduction;

static nb_tensor *reduction_begin(const char *fn, nb_tensor *t, int d, bool keepdim,
                                  nb_dtype dtype, reduction *r) {
    int64_t keep[NB_MAX_DIMS], ost[NB_MAX_DIMS], osh[NB_MAX_DIMS];
    memcpy(keep, t->shape, sizeof keep);
    keep[d] = 1;
    int on = 0;
    for (int i = 0; i < t->ndim; i++)
        if (keepdim || i != d) osh[on++] = keep[i];
    nb_tensor *y = nbi_new(fn, dtype, on, osh, false);
    if (!y) return NULL;
    for (int i = 0, j = 0; i < t->ndim; i++) /* y's strides, in keepdim form */
        ost[i] = (!keepdim && i == d) ? 0 : y->strides[j++];
    const int64_t *st[2] = {ost, t->strides};
    nbi_iter_init(&r->it, t->ndim, keep, 2, st);
    r->len = t->shape[d];
    r->rstride = t->strides[d];
    return y;
}

/* x (..., n, ...) -> out (..., [1], ...): sum over the dim, accumulated in
 * double, k ascending for every output element. When the reduced dim is
 * contiguous each output sums one run; otherwise the k loop is outside the
 * j loop so that rows of x stream through memory (and vectorize), with
 * outputs in blocks of SUM_BLOCK to keep the accumulators in L1. Output
 * ranges run on the thread pool; each output is summed wholly by one. */
#define SUM_BLOCK 512
typedef struct {
    reduction r;
    nb_dtype dt;
    double scale;
    char *po;
    const char *px;
} sum_job;

#define SUM_ROWS(T)                                                                \
    NBI_FOR_SPAN(&r->it, lo, hi, c, jb, je) {                                      \
        if (r->rstride == 1) { /* the reduced dim is contiguous: one run each */   \
            for (int64_t j = jb; j < je; j++) {                                    \
                const T *x = (const T *)px + c.off[1] + j * sx;                    \
                double a = 0;                                                      \
                for (int64_t k = 0; k < r->len; k++) a += x[k];                    \
                ((T *)po)[c.off[0] + j * so] = (T)(a * scale);                     \
            }                                                                      \
            continue;                                                              \
        }                                                                          \
        for (int64_t j0 = jb; j0 < je; j0 += SUM_BLOCK) {                          \
            int64_t nj = je - j0 < SUM_BLOCK ? je - j0 : SUM_BLOCK;                \
            for (int64_t j = 0; j < nj; j++) acc[j] = 0;                           \
            const T *x = (const T *)px + c.off[1] + j0 * sx;                       \
            for (int64_t k = 0; k < r->len; k++, x += r->rstride) {                \
                if (sx == 1)                                                       \
                    for (int64_t j = 0; j < nj; j++) acc[j] += x[j];               \
                else                                                               \
                    for (int64_t j = 0; j < nj; j++) acc[j] += x[j * sx];          \
            }                                                                      \
            T *o = (T *)po + c.off[0] + j0 * so;                                   \
            for (int64_t j = 0; j < nj; j++) o[j * so] = (T)(acc[j] * scale);      \
        }                                                                          \
    }

/* (the column sums, acc[j] += x[j], vectorize: 8 doubles a vector on AVX-512) */
NBI_CLONES static void sum_span(void *ctx, int64_t lo, int64_t hi) {
    const sum_job *job = ctx;
    const reduction *r = &job->r;
    char *po = job->po;
    const char *px = job->px;
    double scale = job->scale, acc[SUM_BLOCK];
    int64_t sx = NBI_INNER(&r->it, 1), so = NBI_INNER(&r->it, 0);
    if (job->dt == NB_F32) SUM_ROWS(float)
    else SUM_ROWS(double)
}

/* sum (scale 1) or mean (scale 1/n) without recording */
static nb_tensor *sum_kernel(const char *fn, nb_tensor *t, int d, bool keepdim, double scale) {
    sum_job j = {.dt = t->dtype, .scale = scale, .px = nbi_ptr(t)};
    nb_tensor *y = reduction_begin(fn, t, d, keepdim, t->dtype, &j.r);
    if (!y) return NULL;
    j.po = nbi_ptr(y);
    nbi_parallel_for(y->numel, nbi_grain_per(NBI_GRAIN, j.r.len), sum_span, &j);
    return y;
}

nb_tensor *nbi_unreduce(nb_tensor *g, int dim, bool keepdim, int ndim, const int64_t *shape) {
    if (!keepdim && ndim > 0) g = nb_unsqueeze(g, dim);
    return nb_expand(g, ndim, shape);
}

/* d[0] = scale (1 or 1/n); i[0] = dim, i[1] = keepdim. Made of recorded
 * ops (a product and views): differentiable again under create_graph. */
static int sum_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    if (n->d[0] != 1.0) g = nb_mul_scalar(g, n->d[0]);
    gin[0] = nbi_unreduce(g, (int)n->i[0], n->i[1], in->ndim, in->shape);
    return gin[0] ? 0 : -1;
}

/* linear: the same sum (or mean) of the tangent */
static nb_tensor *sum_jvp(nbi_node *n, nb_tensor *const *tin) {
    return sum_kernel(n->op, tin[0], (int)n->i[0], n->i[1], n->d[0]);
}

static nb_tensor *sum_op(const char *fn, nb_tensor *t, int dim, bool keepdim, bool mean) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    if (t->ndim == 0) { /* torch allows dim 0 / -1 on a 0-d tensor */
        if (nbi_dim(fn, dim, 0) < 0) return NULL;
        return nbi_alias(fn, t);
    }
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    double scale = mean ? 1.0 / (double)t->shape[d] : 1.0;
    nb_tensor *y = sum_kernel(fn, t, d, keepdim, scale);
    if (!y || !nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, fn, sum_backward, 1, &t);
    if (!n) return nbi_discard(y);
    n->d[0] = scale;
    n->i[0] = d;
    n->i[1] = keepdim;
    n->jvp = sum_jvp;
    return y;
}

nb_tensor *nb_sum(nb_tensor *t, int dim, bool keepdim) {
    return sum_op("nb_sum", t, dim, keepdim, false);
}
nb_tensor *nb_mean(nb_tensor *t, int dim, bool keepdim) {
    return sum_op("nb_mean", t, dim, keepdim, true);
}

/* ------------------------------------------------------------- whole tensor */
static int sum_all_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    if (n->d[0] != 1.0) g = nb_mul_scalar(g, n->d[0]);
    gin[0] = nb_expand(g, in->ndim, in->shape);
    return gin[0] ? 0 : -1;
}

/* x (...) -> () */
/* The sum of every element, in double: element j of each row of the
 * iterator goes to partial sum j % SUM_LANES, and the partial sums are added
 * pairwise at the end. A fixed order (the same bits for any thread count and
 * either branch), and 32 independent additions in flight instead of one
 * chain: the contiguous branch vectorizes. */
#define SUM_LANES 32
#define DEFINE_SUM_ALL(T)                                                         \
    static double sum_all_##T(const nbi_iter *it, const void *p) {               \
        const T *x = p;                                                           \
        double acc[SUM_LANES] = {0};                                              \
        int64_t s = NBI_INNER(it, 0);                                             \
        NBI_FOR_ROWS(it, c) {                                                     \
            const T *row = x + c.off[0];                                          \
            int64_t j = 0;                                                        \
            if (s == 1)                                                           \
                for (; j + SUM_LANES <= it->n; j += SUM_LANES)                    \
                    for (int l = 0; l < SUM_LANES; l++) acc[l] += row[j + l];     \
            for (; j < it->n; j++) acc[j % SUM_LANES] += row[j * s];              \
        }                                                                         \
        for (int w = SUM_LANES / 2; w > 0; w /= 2)                                \
            for (int l = 0; l < w; l++) acc[l] += acc[l + w];                     \
        return acc[0];                                                            \
    }
DEFINE_SUM_ALL(float)
DEFINE_SUM_ALL(double)

/* sum * scale without recording */
static nb_tensor *sum_all_kernel(const char *fn, nb_tensor *t, double scale) {
    nb_tensor *y = nbi_new(fn, t->dtype, 0, NULL, false);
    if (!y) return NULL;
    const int64_t *st[1] = {t->strides};
    nbi_iter it;
    nbi_iter_init(&it, t->ndim, t->shape, 1, st);
    double acc = t->dtype == NB_F32 ? sum_all_float(&it, nbi_ptr(t))
                                     : sum_all_double(&it, nbi_ptr(t));
    nbi_set_flat(y, 0, acc * scale);
    return y;
}

static nb_tensor *sum_all_jvp(nbi_node *n, nb_tensor *const *tin) {
    return sum_all_kernel(n->op, tin[0], n->d[0]);
}

static nb_tensor *sum_all_op(const char *fn, nb_tensor *t, bool mean) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    double scale = mean ? 1.0 / (double)t->numel : 1.0;
    nb_tensor *y = sum_all_kernel(fn, t, scale);
    if (!y || !nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, fn, sum_all_backward, 1, &t);
    if (!n) return nbi_discard(y);
    n->d[0] = scale;
    n->jvp = sum_all_jvp;
    return y;
}

nb_tensor *nb_sum_all(nb_tensor *t) { return sum_all_op("nb_sum_all", t, false); }
nb_tensor *nb_mean_all(nb_tensor *t) { return sum_all_op("nb_mean_all", t, true); }

/* ------------------------------------------------------------- max, argmax */
/* x (..., n, ...) -> values and first index of the max (min when BETTER is <);
 * a NaN counts as the extreme either way, as in torch. */
#define MAX_ROWS(T, BETTER)                                                        \
    NBI_FOR_ROWS(&r.it, c) {                                                       \
        for (int64_t j = 0; j < r.it.n; j++) {                                     \
            const T *x = (const T *)px + c.off[1] + j * NBI_INNER(&r.it, 1);       \
            int64_t best = 0;                                                      \
            T bv = x[0];                                                           \
            for (int64_t k = 1; k < r.len && bv == bv; k++) {                      \
                T v = x[k * r.rstride];                                            \
                if (v BETTER bv || v != v) { bv = v; best = k; }                        \
            }                                                                      \
            int64_t o = c.off[0] + j * NBI_INNER(&r.it, 0);                        \
            if (pv) ((T *)pv)[o] = bv;                                             \
            pi[o] = best;                                                          \
        }                                                                          \
    }

/* Fills idx (and vals, when not NULL), both in the reduction's output layout. */
static void max_kernel(const nb_tensor *t, reduction r, nb_tensor *vals, nb_tensor *idx,
                       bool min) {
    const void *px = nbi_ptr(t);
    void *pv = vals ? nbi_ptr(vals) : NULL;
    int64_t *pi = nbi_ptr(idx);
    if (min) {
        switch (t->dtype) {
        case NB_F32: MAX_ROWS(float, <) break;
        case NB_F64: MAX_ROWS(double, <) break;
        case NB_I64: MAX_ROWS(int64_t, <) break;
        case NB_BOOL: MAX_ROWS(bool, <) break;
        case NB_BF16: break; /* refused by the checks above */
        }
        return;
    }
    switch (t->dtype) {
    case NB_F32: MAX_ROWS(float, >) break;
    case NB_F64: MAX_ROWS(double, >) break;
    case NB_I64: MAX_ROWS(int64_t, >) break;
    case NB_BOOL: MAX_ROWS(bool, >) break;
    case NB_BF16: break; /* refused by the checks above */
    }
}

static int max_check(const char *fn, nb_tensor *t, int dim) {
    if (!nbi_check_no_bf16(fn, t)) return -1;
    int d = nbi_dim(fn, dim, t->ndim);
    if (d >= 0 && t->ndim > 0 && t->shape[d] == 0)
        return (nbi_error("%s: cannot reduce over dim %d of size 0 (shape %s)", fn, dim,
                          NBI_SHAPE(t)), -1);
    return d;
}

/* The gradient goes to the position of the max: zeros with g scattered at
 * the saved indices (node->extra, keepdim layout), a recorded scatter under
 * create_graph; i[0] = dim, i[1] = keepdim, i[2] = min */
static int max_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    int d = (int)n->i[0];
    nb_tensor *gk = n->i[1] ? g : nb_unsqueeze(g, d);
    const char *op = n->i[2] ? "nb_min's backward (scatter)" : "nb_max's backward (scatter)";
    gin[0] = gk ? nbi_scatter(op, gk, d, n->extra, NBI_SCATTER_SET, in->ndim, in->shape) : NULL;
    return gin[0] ? 0 : -1;
}

/* The tangent at the position of the max. */
static nb_tensor *max_jvp(nbi_node *n, nb_tensor *const *tin) {
    int d = (int)n->i[0];
    nb_tensor *t = nb_gather(tin[0], d, n->extra);
    return n->i[1] || !t ? t : nb_squeeze(t, d);
}

static nb_tensor *minmax_op(const char *fn, nb_tensor *t, int dim, bool keepdim, bool min) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    if (t->ndim == 0) return nbi_dim(fn, dim, 0) < 0 ? NULL : nbi_alias(fn, t);
    int d = max_check(fn, t, dim);
    if (d < 0) return NULL;
    reduction r;
    nb_tensor *y = reduction_begin(fn, t, d, keepdim, t->dtype, &r);
    nb_tensor *idx = y ? nbi_new(fn, NB_I64, y->ndim, y->shape, false) : NULL;
    if (!idx) return nbi_discard(y);
    max_kernel(t, r, y, idx, min);
    if (!nbi_needs_grad(1, &t)) {
        nb_free(idx);
        return y;
    }
    nbi_node *n = nbi_record(y, fn, max_backward, 1, &t);
    nb_tensor *kidx = keepdim ? idx : nb_unsqueeze(idx, d);
    if (!n || !kidx) {
        nb_free(idx);
        return nbi_discard(y);
    }
    n->i[0] = d;
    n->i[1] = keepdim;
    n->i[2] = min;
    n->extra = nbi_unscoped(kidx); /* the node holds the indices, keepdim layout */
    n->jvp = max_jvp;
    if (kidx != idx) nb_free(idx);
    return y;
}

nb_tensor *nb_max(nb_tensor *t, int dim, bool keepdim) {
    return minmax_op("nb_max", t, dim, keepdim, false);
}
nb_tensor *nb_min(nb_tensor *t, int dim, bool keepdim) {
    return minmax_op("nb_min", t, dim, keepdim, true);
}

nb_tensor *nb_argmax(nb_tensor *t, int dim, bool keepdim) {
    const char *fn = "nb_argmax";
    if (!nbi_arg(fn, t, 0) || !nbi_check_no_bf16(fn, t)) return NULL;
    if (t->ndim == 0) return nbi_dim(fn, dim, 0) < 0 ? NULL : nb_zeros(NB_I64, 0, NULL);
    int d = max_check(fn, t, dim);
    if (d < 0) return NULL;
    reduction r;
    nb_tensor *idx = reduction_begin(fn, t, d, keepdim, NB_I64, &r);
    if (idx) max_kernel(t, r, NULL, idx, false);
    return idx;
}

/* ------------------------------------------ sum, mean, var, std over dims */
/* A reduction over a set of dims (a bit mask): each output element (y
 * contiguous, kept dims in order) reads the sub-tensor of t at `base` spanned
 * by the reduced dims, in row-major order. */
typedef struct {
    int nk, nr;
    int64_t ksh[NB_MAX_DIMS], kst[NB_MAX_DIMS]; /* kept dims of t */
    int64_t rsh[NB_MAX_DIMS], rst[NB_MAX_DIMS]; /* reduced dims of t */
    int64_t n;                                  /* elements per output */
    nb_dtype dt;
    const char *px;
    char *po;
    int mode;          /* MR_SUM: sum * scale; MR_VAR, MR_STD */
    double scale, corr;
} mred;
enum { MR_SUM, MR_VAR, MR_STD };

/* Validates dims (negative ones allowed; ndims 0 = every dim) into a mask. */
static int mred_mask(const char *fn, const nb_tensor *t, int ndims, const int *dims,
                     uint32_t *mask) {
    *mask = 0;
    if (ndims < 0 || ndims > NB_MAX_DIMS || (ndims > 0 && !dims))
        return (nbi_error("%s: ndims %d must be in [0, %d] with dims not NULL", fn, ndims,
                          NB_MAX_DIMS), -1);
    if (ndims == 0) {
        *mask = t->ndim ? (uint32_t)((1u << t->ndim) - 1) : 0;
        return 0;
    }
    for (int i = 0; i < ndims; i++) {
        int d = nbi_dim(fn, dims[i], t->ndim ? t->ndim : 1); /* a 0-d t takes 0 / -1 */
        if (d < 0) return -1;
        if (*mask & (1u << d))
            return (nbi_error("%s: dim %d appears more than once in dims", fn, dims[i]), -1);
        *mask |= 1u << d;
    }
    if (t->ndim == 0) *mask = 0;
    return 0;
}

static nb_tensor *mred_begin(const char *fn, nb_tensor *t, uint32_t mask, bool keepdim,
                             mred *m) {
    int64_t osh[NB_MAX_DIMS];
    int on = 0;
    m->nk = m->nr = 0;
    m->n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (mask & (1u << i)) {
            m->rsh[m->nr] = t->shape[i];
            m->rst[m->nr++] = t->strides[i];
            m->n *= t->shape[i];
            if (keepdim) osh[on++] = 1;
        } else {
            m->ksh[m->nk] = t->shape[i];
            m->kst[m->nk++] = t->strides[i];
            osh[on++] = t->shape[i];
        }
    }
    m->dt = t->dtype;
    m->px = nbi_ptr(t);
    nb_tensor *y = nbi_new(fn, t->dtype, on, osh, false);
    if (y) m->po = nbi_ptr(y);
    return y;
}

/* Sum over the reduced sub-tensor at base of (x - sub)^(sq ? 2 : 1), in
 * double, row-major order whatever the thread count. */
#define MRED_WALK(T)                                                               \
    {                                                                              \
        const T *x = (const T *)m->px;                                             \
        int64_t idx[NB_MAX_DIMS] = {0}, off = base;                                \
        int64_t in = m->nr ? m->rsh[m->nr - 1] : 1, is = m->nr ? m->rst[m->nr - 1] : 0; \
        for (;;) {                                                                 \
            if (sq)                                                                \
                for (int64_t k = 0; k < in; k++) {                                 \
                    double v = (double)x[off + k * is] - sub;                      \
                    a += v * v;                                                    \
                }                                                                  \
            else                                                                   \
                for (int64_t k = 0; k < in; k++) a += x[off + k * is];             \
            int q = m->nr - 2;                                                     \
            for (; q >= 0; q--) {                                                  \
                off += m->rst[q];                                                  \
                if (++idx[q] < m->rsh[q]) break;                                   \
                off -= idx[q] * m->rst[q];                                         \
                idx[q] = 0;                                                        \
            }                                                                      \
            if (q < 0) break;                                                      \
        }                                                                          \
    }

static double mred_walk(const mred *m, int64_t base, double sub, bool sq) {
    double a = 0;
    if (m->n == 0) return 0;
    if (m->dt == NB_F32) MRED_WALK(float)
    else MRED_WALK(double)
    return a;
}

static void mred_span(void *ctx, int64_t lo, int64_t hi) {
    const mred *m = ctx;
    for (int64_t o = lo; o < hi; o++) {
        int64_t base = 0, r = o;
        for (int q = m->nk - 1; q >= 0; q--) {
            base += (r % m->ksh[q]) * m->kst[q];
            r /= m->ksh[q];
        }
        double v;
        if (m->mode == MR_SUM) {
            v = mred_walk(m, base, 0, false) * m->scale;
        } else { /* two passes: the mean, then squared deviations from it */
            double mean = mred_walk(m, base, 0, false) / (double)m->n;
            double den = (double)m->n - m->corr;
            v = mred_walk(m, base, mean, true) / (den > 0 ? den : 0.0);
            if (m->mode == MR_STD) v = sqrt(v);
        }
        if (m->dt == NB_F32) ((float *)m->po)[o] = (float)v;
        else ((double *)m->po)[o] = v;
    }
}

static nb_tensor *mred_run(const char *fn, nb_tensor *t, uint32_t mask, bool keepdim, mred *m) {
    nb_tensor *y = mred_begin(fn, t, mask, keepdim, m);
    if (!y) return NULL;
    int64_t cost = m->mode == MR_SUM || m->n > INT64_MAX / 2 ? m->n : 2 * m->n;
    nbi_parallel_for(y->numel, nbi_grain_per(NBI_GRAIN, cost), mred_span, m);
    return y;
}

/* g (reduced shape) -> g with the reduced dims back as size 1 */
static nb_tensor *unreduce_keep(nb_tensor *g, uint32_t mask, bool keepdim, int ndim) {
    if (keepdim) return g;
    for (int i = 0; i < ndim && g; i++)
        if (mask & (1u << i)) g = nb_unsqueeze(g, i);
    return g;
}

static nb_tensor *mred_record(const char *fn, nb_tensor *t, uint32_t mask, bool keepdim,
                              int mode, bool mean, double corr);

/* d[0] = scale; i[0] = mask, i[1] = keepdim. Recorded ops only. */
static int sum_dims_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    if (n->d[0] != 1.0) g = nb_mul_scalar(g, n->d[0]);
    g = unreduce_keep(g, (uint32_t)n->i[0], n->i[1], in->ndim);
    gin[0] = g ? nb_expand(g, in->ndim, in->shape) : NULL;
    return gin[0] ? 0 : -1;
}

static nb_tensor *sum_dims_jvp(nbi_node *n, nb_tensor *const *tin) {
    mred m = {.mode = MR_SUM, .scale = n->d[0]};
    return mred_run(n->op, tin[0], (uint32_t)n->i[0], n->i[1], &m);
}

/* var's node input x minus its mean over the reduced dims (kept as size
 * 1); the mean is an nb_mean_dims node when x has a graph and grad mode is
 * on (create_graph), so that the second derivative sees it. */
static nb_tensor *centered(const nbi_node *n) {
    nb_tensor *x = nbi_saved_in(n, 0);
    if (!x) return NULL;
    nb_tensor *mean = mred_record("nb_mean_dims", x, (uint32_t)n->i[0], true, MR_SUM, true, 0);
    return mean ? nb_sub(x, mean) : NULL;
}

/* var' = 2 (x - mean) / (N - correction) g, std' = var' / (2 std) (zero where
 * std is 0), as torch's var_backward / std_backward, of recorded ops;
 * d[1] = correction, d[2] = N, i[2] = std */
static int var_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    if (n->i[2]) {
        nb_tensor *sd = nbi_saved_out(n), *zero = nb_zeros(g->dtype, 0, NULL);
        if (!sd || !zero) return -1;
        g = nb_masked_fill(nb_div(g, nb_mul_scalar(sd, 2)), nb_eq(sd, zero), 0);
    }
    nb_tensor *xc = centered(n);
    if (!xc) return -1;
    g = unreduce_keep(g, (uint32_t)n->i[0], n->i[1], in->ndim);
    gin[0] = nb_mul(nb_mul_scalar(xc, 2.0 / (n->d[2] - n->d[1])), g);
    return gin[0] ? 0 : -1;
}

/* torch's var_jvp: 2 / (N - correction) * sum((x - mean) * t); std's is
 * that / (2 std), NaN where std is 0 as in torch (backward gives 0 there). */
static nb_tensor *var_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *xc = centered(n), *prod = xc ? nb_mul(xc, tin[0]) : NULL;
    if (!prod) return NULL;
    mred m = {.mode = MR_SUM, .scale = 2.0 / (n->d[2] - n->d[1])};
    nb_tensor *v = mred_run(n->op, prod, (uint32_t)n->i[0], n->i[1], &m);
    if (!v || !n->i[2]) return v;
    nb_tensor *sd = nbi_saved_out(n);
    return sd ? nb_div(v, nb_mul_scalar(sd, 2)) : NULL;
}

/* t reduced over the dims of mask, recorded when t needs grad */
static nb_tensor *mred_record(const char *fn, nb_tensor *t, uint32_t mask, bool keepdim,
                              int mode, bool mean, double corr) {
    int64_t cnt = 1;
    for (int i = 0; i < t->ndim; i++)
        if (mask & (1u << i)) cnt *= t->shape[i];
    /* inf for an empty reduction, so that the mean is 0 * inf = NaN */
    mred m = {.mode = mode, .scale = mean ? 1.0 / (double)cnt : 1.0, .corr = corr};
    nb_tensor *y = mred_run(fn, t, mask, keepdim, &m);
    if (!y || !nbi_needs_grad(1, &t)) return y;
    bool sum = mode == MR_SUM;
    nbi_node *n = nbi_record(y, fn, sum ? sum_dims_backward : var_backward, 1, &t);
    if (!n) return nbi_discard(y);
    n->d[0] = m.scale;
    n->d[1] = corr;
    n->d[2] = (double)m.n;
    n->i[0] = mask;
    n->i[1] = keepdim;
    n->i[2] = mode == MR_STD;
    if (!sum) nbi_save(n, NBI_SAVE_IN(0) | (mode == MR_STD ? NBI_SAVE_OUT : 0));
    n->jvp = sum ? sum_dims_jvp : var_jvp;
    return y;
}

static nb_tensor *mred_op(const char *fn, nb_tensor *t, int ndims, const int *dims, bool keepdim,
                          int mode, bool mean, double corr) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    uint32_t mask;
    if (mred_mask(fn, t, ndims, dims, &mask) < 0) return NULL;
    if (mode != MR_SUM && !isfinite(corr))
        return nbi_error("%s: correction %g must be finite", fn, corr), NULL;
    return mred_record(fn, t, mask, keepdim, mode, mean, corr);
}

nb_tensor *nb_sum_dims(nb_tensor *t, int ndims, const int *dims, bool keepdim) {
    return mred_op("nb_sum_dims", t, ndims, dims, keepdim, MR_SUM, false, 0);
}
nb_tensor *nb_mean_dims(nb_tensor *t, int ndims, const int *dims, bool keepdim) {
    return mred_op("nb_mean_dims", t, ndims, dims, keepdim, MR_SUM, true, 0);
}
nb_tensor *nb_var(nb_tensor *t, int ndims, const int *dims, double correction, bool keepdim) {
    return mred_op("nb_var", t, ndims, dims, keepdim, MR_VAR, false, correction);
}
nb_tensor *nb_std(nb_tensor *t, int ndims, const int *dims, double correction, bool keepdim) {
    return mred_op("nb_std", t, ndims, dims, keepdim, MR_STD, false, correction);
}

/* ------------------------------------------------------------------ cumsum */
/* x (..., n, ...) -> y (..., n, ...): running sums along dim, accumulated in
 * double and rounded per element, as torch's CPU kernel (acc_type of float
 * is double there); reverse runs from the end (the backward rule). */
typedef struct {
    nbi_iter it;
    int64_t len, xs, ys;
    nb_dtype dt;
    bool reverse;
    const char *px;
    char *py;
} cum_job;

#define CUM_ROWS(T)                                                                \
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {                                      \
        for (int64_t q = jb; q < je; q++) {                                        \
            const T *x = (const T *)j->px + c.off[1] + q * NBI_INNER(&j->it, 1);   \
            T *y = (T *)j->py + c.off[0] + q * NBI_INNER(&j->it, 0);               \
            double a = 0;                                                          \
            for (int64_t k0 = 0; k0 < j->len; k0++) {                              \
                int64_t k = j->reverse ? j->len - 1 - k0 : k0;                     \
                a += x[k * j->xs];                                                 \
                y[k * j->ys] = (T)a;                                               \
            }                                                                      \
        }                                                                          \
    }

static void cum_span(void *ctx, int64_t lo, int64_t hi) {
    const cum_job *j = ctx;
    if (j->dt == NB_F32) CUM_ROWS(float)
    else CUM_ROWS(double)
}

static nb_tensor *cum_kernel(const char *fn, nb_tensor *t, int d, bool reverse) {
    nb_tensor *y = nbi_new_like(fn, t, false);
    if (!y || t->ndim == 0) {
        if (y) nbi_set_flat(y, 0, nbi_get_flat(t, 0));
        return y;
    }
    cum_job j = {.len = t->shape[d], .xs = t->strides[d], .ys = y->strides[d], .dt = t->dtype,
                 .reverse = reverse, .px = nbi_ptr(t), .py = nbi_ptr(y)};
    int64_t keep[NB_MAX_DIMS];
    memcpy(keep, t->shape, sizeof keep);
    keep[d] = 1;
    const int64_t *st[2] = {y->strides, t->strides};
    nbi_iter_init(&j.it, t->ndim, keep, 2, st);
    int64_t lines = j.len ? t->numel / j.len : 0;
    nbi_parallel_for(lines, nbi_grain_per(NBI_GRAIN, j.len), cum_span, &j);
    return y;
}

static nb_tensor *cumsum_op(const char *fn, nb_tensor *t, int d, bool reverse);

/* i[0] = dim, i[1] = reverse: the cumsum of g the other way, recorded */
static int cumsum_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = cumsum_op(n->i[1] ? "nb_cumsum" : "nb_cumsum's backward (reverse cumsum)", g,
                       (int)n->i[0], !n->i[1]);
    return gin[0] ? 0 : -1;
}

static nb_tensor *cumsum_jvp(nbi_node *n, nb_tensor *const *tin) {
    return cum_kernel(n->op, tin[0], (int)n->i[0], n->i[1]);
}

/* a cumsum either way, recorded when t needs grad */
static nb_tensor *cumsum_op(const char *fn, nb_tensor *t, int d, bool reverse) {
    nb_tensor *y = cum_kernel(fn, t, d, reverse);
    if (!y || !nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, fn, cumsum_backward, 1, &t);
    if (!n) return nbi_discard(y);
    n->i[0] = d;
    n->i[1] = reverse;
    n->jvp = cumsum_jvp;
    return y;
}

nb_tensor *nb_cumsum(nb_tensor *t, int dim) {
    const char *fn = "nb_cumsum";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    int d = nbi_dim(fn, dim, t->ndim ? t->ndim : 1);
    if (d < 0) return NULL;
    return cumsum_op(fn, t, d, false);
}

/* --------------------------------------------------------------- sum_to */
nb_tensor *nbi_sum_to(nb_tensor *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    if (g->ndim == ndim && !memcmp(g->shape, shape, (size_t)ndim * sizeof *shape)) return g;
    if (g->dtype == NB_BF16) /* summed in f32, rounded once */
        return nb_to(nbi_sum_to(nb_to(g, NB_F32), ndim, shape), NB_BF16);
    int lead = g->ndim - ndim;
    /* under create_graph g has a history: the same sums, recorded */
    bool record = nbi_needs_grad(1, &g);
    nb_tensor *s = g;
    for (int i = 0; i < g->ndim && s; i++) {
        bool reduce = i < lead || (shape[i - lead] == 1 && g->shape[i] != 1);
        if (reduce) s = record ? nb_sum(s, i, true) : sum_kernel("nb_backward", s, i, true, 1.0);
    }
    return s ? nb_reshape(s, ndim, shape) : NULL;
}
