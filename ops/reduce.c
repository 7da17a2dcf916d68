/* reduce.c: sums, means and maxima over one dim or over everything, their
 * backward rules, and nbi_sum_to, which undoes broadcasting in backward. */
#include "ops_internal.h"

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

static void sum_span(void *ctx, int64_t lo, int64_t hi) {
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
    nbi_parallel_for(y->numel, NBI_GRAIN / (j.r.len + 1) + 1, sum_span, &j);
    return y;
}

nb_tensor *nbi_unreduce(nb_tensor *g, int dim, bool keepdim, int ndim, const int64_t *shape) {
    if (!keepdim && ndim > 0) g = nb_unsqueeze(g, dim);
    return nb_expand(g, ndim, shape);
}

/* d[0] = scale (1 or 1/n); i[0] = dim, i[1] = keepdim */
static int sum_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0];
    if (n->d[0] != 1.0) g = nb_mul_scalar(g, n->d[0]);
    gin[0] = nbi_unreduce(g, (int)n->i[0], n->i[1], in->ndim, in->shape);
    return gin[0] ? 0 : -1;
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
static nb_tensor *sum_all_op(const char *fn, nb_tensor *t, bool mean) {
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    nb_tensor *y = nbi_new(fn, t->dtype, 0, NULL, false);
    if (!y) return NULL;
    const int64_t *st[1] = {t->strides};
    nbi_iter it;
    nbi_iter_init(&it, t->ndim, t->shape, 1, st);
    double acc = 0;
    int64_t s = NBI_INNER(&it, 0);
    if (t->dtype == NB_F32) {
        const float *x = nbi_ptr(t);
        NBI_FOR_ROWS(&it, c) for (int64_t j = 0; j < it.n; j++) acc += x[c.off[0] + j * s];
    } else {
        const double *x = nbi_ptr(t);
        NBI_FOR_ROWS(&it, c) for (int64_t j = 0; j < it.n; j++) acc += x[c.off[0] + j * s];
    }
    double scale = mean ? 1.0 / (double)t->numel : 1.0;
    nbi_set_flat(y, 0, acc * scale);
    if (!nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, fn, sum_all_backward, 1, &t);
    if (!n) return nbi_discard(y);
    n->d[0] = scale;
    return y;
}

nb_tensor *nb_sum_all(nb_tensor *t) { return sum_all_op("nb_sum_all", t, false); }
nb_tensor *nb_mean_all(nb_tensor *t) { return sum_all_op("nb_mean_all", t, true); }

/* ------------------------------------------------------------- max, argmax */
/* x (..., n, ...) -> values and first index of the max (NaN counts as max) */
#define MAX_ROWS(T)                                                                \
    NBI_FOR_ROWS(&r.it, c) {                                                       \
        for (int64_t j = 0; j < r.it.n; j++) {                                     \
            const T *x = (const T *)px + c.off[1] + j * NBI_INNER(&r.it, 1);       \
            int64_t best = 0;                                                      \
            T bv = x[0];                                                           \
            for (int64_t k = 1; k < r.len && bv == bv; k++) {                      \
                T v = x[k * r.rstride];                                            \
                if (v > bv || v != v) { bv = v; best = k; }                        \
            }                                                                      \
            int64_t o = c.off[0] + j * NBI_INNER(&r.it, 0);                        \
            if (pv) ((T *)pv)[o] = bv;                                             \
            pi[o] = best;                                                          \
        }                                                                          \
    }

/* Fills idx (and vals, when not NULL), both in the reduction's output layout. */
static void max_kernel(const nb_tensor *t, reduction r, nb_tensor *vals, nb_tensor *idx) {
    const void *px = nbi_ptr(t);
    void *pv = vals ? nbi_ptr(vals) : NULL;
    int64_t *pi = nbi_ptr(idx);
    switch (t->dtype) {
    case NB_F32: MAX_ROWS(float) break;
    case NB_F64: MAX_ROWS(double) break;
    case NB_I64: MAX_ROWS(int64_t) break;
    case NB_BOOL: MAX_ROWS(bool) break;
    }
}

static int max_check(const char *fn, nb_tensor *t, int dim) {
    int d = nbi_dim(fn, dim, t->ndim);
    if (d >= 0 && t->ndim > 0 && t->shape[d] == 0)
        return (nbi_error("%s: cannot reduce over dim %d of size 0 (shape %s)", fn, dim,
                          NBI_SHAPE(t)), -1);
    return d;
}

/* The gradient goes to the position of the max: zeros with g scattered at
 * the saved indices (node->extra, keepdim layout). */
static int max_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *in = n->in[0], *idx = n->extra;
    int d = (int)n->i[0];
    nb_tensor *z = nb_zeros(g->dtype, in->ndim, in->shape);
    if (!z) return -1;
    nb_tensor *gk = n->i[1] ? g : nb_unsqueeze(g, d);
    if (!gk) return -1;
    int64_t keep[NB_MAX_DIMS];
    memcpy(keep, in->shape, sizeof keep);
    keep[d] = 1;
    const int64_t *st[3] = {z->strides, gk->strides, idx->strides};
    nbi_iter it;
    nbi_iter_init(&it, in->ndim, keep, 3, st);
    int64_t zs = z->strides[d];
    const int64_t *pi = nbi_ptr(idx);
    NBI_FOR_ROWS(&it, c) {
        for (int64_t j = 0; j < it.n; j++) {
            int64_t k = pi[c.off[2] + j * NBI_INNER(&it, 2)];
            int64_t zo = c.off[0] + j * NBI_INNER(&it, 0) + k * zs, go = c.off[1] + j * NBI_INNER(&it, 1);
            if (g->dtype == NB_F32)
                ((float *)nbi_ptr(z))[zo] = ((const float *)nbi_ptr(gk))[go];
            else
                ((double *)nbi_ptr(z))[zo] = ((const double *)nbi_ptr(gk))[go];
        }
    }
    gin[0] = z;
    return 0;
}

nb_tensor *nb_max(nb_tensor *t, int dim, bool keepdim) {
    const char *fn = "nb_max";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    if (t->ndim == 0) return nbi_dim(fn, dim, 0) < 0 ? NULL : nbi_alias(fn, t);
    int d = max_check(fn, t, dim);
    if (d < 0) return NULL;
    reduction r;
    nb_tensor *y = reduction_begin(fn, t, d, keepdim, t->dtype, &r);
    nb_tensor *idx = y ? nbi_new(fn, NB_I64, y->ndim, y->shape, false) : NULL;
    if (!idx) return nbi_discard(y);
    max_kernel(t, r, y, idx);
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
    n->extra = nbi_unscoped(kidx); /* the node holds the indices, keepdim layout */
    if (kidx != idx) nb_free(idx);
    return y;
}

nb_tensor *nb_argmax(nb_tensor *t, int dim, bool keepdim) {
    const char *fn = "nb_argmax";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (t->ndim == 0) return nbi_dim(fn, dim, 0) < 0 ? NULL : nb_zeros(NB_I64, 0, NULL);
    int d = max_check(fn, t, dim);
    if (d < 0) return NULL;
    reduction r;
    nb_tensor *idx = reduction_begin(fn, t, d, keepdim, NB_I64, &r);
    if (idx) max_kernel(t, r, NULL, idx);
    return idx;
}

/* --------------------------------------------------------------- sum_to */
nb_tensor *nbi_sum_to(nb_tensor *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    if (g->ndim == ndim && !memcmp(g->shape, shape, (size_t)ndim * sizeof *shape)) return g;
    int lead = g->ndim - ndim;
    nb_tensor *s = g;
    for (int i = 0; i < g->ndim && s; i++) {
        bool reduce = i < lead || (shape[i - lead] == 1 && g->shape[i] != 1);
        if (reduce) s = sum_kernel("nb_backward", s, i, true, 1.0);
    }
    return s ? nb_reshape(s, ndim, shape) : NULL;
}
