/* index.c: picking elements by integer index: nb_gather and
 * nb_index_select (the core of embeddings and of cross entropy). Both read
 * t at positions where one dim's coordinate comes from an index tensor; the
 * gradient adds g back into those positions, in a fixed order. That
 * putting back is an op of its own (nbi_scatter), recorded under
 * create_graph, which the backward rules of max, min, sort and topk use too. */
#include "index_internal.h"

#include <stdlib.h>
#include <string.h>

/* The shared walk: over the output's shape, `ist` are the index strides and
 * t is read with its strides except along dim, where the coordinate is the
 * index value. Returns false (and a message) for an index out of range. */
typedef struct {
    nbi_iter it;
    int64_t dim_stride, dim_size;
} pick;

static void pick_init(pick *p, const nb_tensor *out_like, const int64_t *ost, const int64_t *ist,
                      const nb_tensor *t, int dim) {
    int64_t tst[NB_MAX_DIMS];
    memcpy(tst, t->strides, sizeof tst);
    tst[dim] = 0;
    const int64_t *st[3] = {ost, ist, tst};
    nbi_iter_init(&p->it, out_like->ndim, out_like->shape, 3, st);
    p->dim_stride = t->strides[dim];
    p->dim_size = t->shape[dim];
}

static bool check_range(const char *fn, const nb_tensor *idx, int64_t size, int dim) {
    const int64_t *st[1] = {idx->strides};
    nbi_iter it;
    nbi_iter_init(&it, idx->ndim, idx->shape, 1, st);
    const int64_t *p = nbi_ptr(idx);
    NBI_FOR_ROWS(&it, c) {
        for (int64_t j = 0; j < it.n; j++) {
            int64_t v = p[c.off[0] + j * NBI_INNER(&it, 0)];
            if (v < 0 || v >= size)
                return nbi_error("%s: index %lld out of range for dim %d of size %lld", fn,
                                 (long long)v, dim, (long long)size), false;
        }
    }
    return true;
}

/* out (...) <- t[..., index, ...]: o is out's offset, k the index's, x t's base */
#define GATHER_ROWS(T)                                                                 \
    NBI_FOR_ROWS(&p.it, c) {                                                           \
        for (int64_t j = 0; j < p.it.n; j++) {                                         \
            int64_t k = pi[c.off[1] + j * NBI_INNER(&p.it, 1)];                        \
            ((T *)po)[c.off[0] + j * NBI_INNER(&p.it, 0)] =                            \
                ((const T *)pt)[c.off[2] + j * NBI_INNER(&p.it, 2) + k * p.dim_stride]; \
        }                                                                              \
    }
/* the reverse: t[..., index, ...] OP g (...), OP += (accumulating) or = */
#define SCATTER_ROWS(T, OP)                                                            \
    NBI_FOR_ROWS(&p.it, c) {                                                           \
        for (int64_t j = 0; j < p.it.n; j++) {                                         \
            int64_t k = pi[c.off[1] + j * NBI_INNER(&p.it, 1)];                        \
            ((T *)pt)[c.off[2] + j * NBI_INNER(&p.it, 2) + k * p.dim_stride] OP        \
                ((const T *)po)[c.off[0] + j * NBI_INNER(&p.it, 0)];                   \
        }                                                                              \
    }

static void gather_into(nb_tensor *out, const int64_t *ist, const nb_tensor *idx,
                        const nb_tensor *t, int dim) {
    pick p;
    pick_init(&p, out, out->strides, ist, t, dim);
    void *po = nbi_ptr(out);
    const void *pt = nbi_ptr(t);
    const int64_t *pi = nbi_ptr(idx);
    switch (t->dtype) {
    case NB_F32: GATHER_ROWS(float) break;
    case NB_F64: GATHER_ROWS(double) break;
    case NB_I64: GATHER_ROWS(int64_t) break;
    case NB_BOOL: GATHER_ROWS(bool) break;
    case NB_BF16: break; /* refused by the checks above */
    }
}

/* index_select's gradient along dim 0 added straight into acc, the
 * gradient t has so far (nbi_grad_sink): per row of t, the rows of g that
 * picked it summed in their order, then added once, as the dense path's
 * scatter and the engine's sum would. Skips a zero tensor of t's size: a
 * GPT's tied embedding would otherwise allocate and add its whole (vocab, C). */
typedef struct {
    int64_t row, pos;
} pick_pos;

static int by_row(const void *a, const void *b) {
    const pick_pos *x = a, *y = b;
    return x->row != y->row ? (x->row > y->row) - (x->row < y->row) : (x->pos > y->pos) - (x->pos < y->pos);
}

#define ADD_ROWS_INTO(T)                                                                \
    for (int64_t k = 0; k < n;) {                                                      \
        T *sum = (T *)tmp;                                                             \
        const T *gi = (const T *)pg + pp[k].pos * D;                                   \
        for (int64_t e = 0; e < D; e++) sum[e] = gi[e];                                \
        int64_t r = pp[k].row;                                                         \
        for (k++; k < n && pp[k].row == r; k++) {                                      \
            gi = (const T *)pg + pp[k].pos * D;                                        \
            for (int64_t e = 0; e < D; e++) sum[e] += gi[e];                           \
        }                                                                              \
        T *a = (T *)pa + r * D;                                                        \
        for (int64_t e = 0; e < D; e++) a[e] = a[e] + sum[e];                          \
    }

static bool select_into(nb_tensor *acc, const nb_tensor *g, const nb_tensor *idx) {
    int64_t n = idx->shape[0], D = acc->shape[0] ? acc->numel / acc->shape[0] : 0;
    pick_pos *pp = malloc((size_t)(n ? n : 1) * sizeof *pp);
    void *tmp = malloc((size_t)(D ? D : 1) * nbi_dtype_size(g->dtype));
    if (!pp || !tmp) {
        free(pp);
        free(tmp);
        return false; /* the dense path then */
    }
    const int64_t *pi = nbi_ptr(idx);
    for (int64_t k = 0; k < n; k++) pp[k] = (pick_pos){pi[k * idx->strides[0]], k};
    qsort(pp, (size_t)n, sizeof *pp, by_row);
    const void *pg = nbi_ptr(g);
    void *pa = nbi_ptr(acc);
    if (g->dtype == NB_F32) ADD_ROWS_INTO(float)
    else ADD_ROWS_INTO(double)
    free(pp);
    free(tmp);
    return true;
}

/* The index strides of a pick over an output of idx's rank: gather reads
 * idx along every dim, index_select (1-d idx) along dim only. */
static void index_strides(const nb_tensor *idx, int dim, bool select, int64_t *ist) {
    memset(ist, 0, NB_MAX_DIMS * sizeof *ist);
    if (select) ist[dim] = idx->strides[0];
    else memcpy(ist, idx->strides, (size_t)idx->ndim * sizeof *ist);
}

/* src (...) -> z (shape): zeros with src put back where gather (or
 * index_select) along dim read it; added in src's row-major order, or
 * written when no position repeats. */
static nb_tensor *scatter_kernel(nb_tensor *src, int dim, const nb_tensor *idx,
                                 nbi_scatter_mode mode, int ndim, const int64_t *shape) {
    nb_tensor *z = nb_zeros(src->dtype, ndim, shape);
    if (!z) return NULL;
    int64_t ist[NB_MAX_DIMS];
    index_strides(idx, dim, mode == NBI_INDEX_ADD, ist);
    pick p;
    pick_init(&p, src, src->strides, ist, z, dim);
    const void *po = nbi_ptr(src);
    void *pt = nbi_ptr(z);
    const int64_t *pi = nbi_ptr(idx);
    bool f32 = src->dtype == NB_F32;
    if (mode == NBI_SCATTER_SET) {
        if (f32) SCATTER_ROWS(float, =)
        else SCATTER_ROWS(double, =)
    } else {
        if (f32) SCATTER_ROWS(float, +=)
        else SCATTER_ROWS(double, +=)
    }
    return z;
}

/* The scatter's transpose, which reads g where the scatter wrote: a
 * gather (or an index_select), recorded. */
static nb_tensor *unscatter(nb_tensor *g, int dim, nb_tensor *idx, nbi_scatter_mode mode) {
    return mode == NBI_INDEX_ADD ? nb_index_select(g, dim, idx) : nb_gather(g, dim, idx);
}

/* node: in[0] = src, in[1] = index (saved); i[0] = dim, i[1] = mode */
static int scatter_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *idx = nbi_saved_in(n, 1);
    gin[0] = idx ? unscatter(g, (int)n->i[0], idx, (nbi_scatter_mode)n->i[1]) : NULL;
    return gin[0] ? 0 : -1;
}

/* linear in src: the same scatter of its tangent */
static nb_tensor *scatter_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *idx = nbi_saved_in(n, 1);
    if (!idx) return NULL;
    if (!tin[0]) return nbi_zero_tangent(n);
    return scatter_kernel(tin[0], (int)n->i[0], idx, (nbi_scatter_mode)n->i[1], n->out->ndim,
                          n->out->shape);
}

nb_tensor *nbi_scatter(const char *op, nb_tensor *src, int dim, nb_tensor *idx,
                       nbi_scatter_mode mode, int ndim, const int64_t *shape) {
    nb_tensor *z = scatter_kernel(src, dim, idx, mode, ndim, shape);
    nb_tensor *in[2] = {src, idx};
    if (!z || !nbi_needs_grad(2, in)) return z;
    nbi_node *n = nbi_record(z, op, scatter_backward, 2, in);
    if (!n) return nbi_discard(z);
    n->i[0] = dim;
    n->i[1] = mode;
    nbi_save(n, NBI_SAVE_IN(1));
    n->jvp = scatter_jvp;
    return z;
}

/* node: in[0] = t, in[1] = index (version-checked: backward re-reads it);
 * i[0] = dim, i[1] = 1 for index_select. The gradient is the scatter of g;
 * in a plain backward index_select's along dim 0 adds into the gradient
 * the tied weight has so far, when there is one (nbi_grad_sink). */
static int pick_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const nb_tensor *t = n->in[0]; /* its shape only */
    nb_tensor *idx = nbi_saved_in(n, 1);
    if (!idx) return -1;
    int dim = (int)n->i[0];
    bool select = n->i[1];
    bool sink = select && dim == 0 && !nbi_create_graph() && nb_is_contiguous(g);
    nb_tensor *acc = sink ? nbi_grad_sink(n, 0) : NULL;
    if (acc && select_into(acc, g, idx)) return 0;
    gin[0] = nbi_scatter(select ? "nb_index_select's backward (index-add)"
                                : "nb_gather's backward (scatter-add)",
                         g, dim, idx, select ? NBI_INDEX_ADD : NBI_SCATTER_ADD, t->ndim, t->shape);
    return gin[0] ? 0 : -1;
}

/* The tangent is the same pick of t's tangent. */
static nb_tensor *pick_jvp(nbi_node *n, nb_tensor *const *tin) {
    nb_tensor *idx = nbi_saved_in(n, 1);
    if (!idx) return NULL;
    if (!tin[0]) return nbi_zero_tangent(n);
    int dim = (int)n->i[0];
    return n->i[1] ? nb_index_select(tin[0], dim, idx) : nb_gather(tin[0], dim, idx);
}

static nb_tensor *pick_op(const char *fn, nb_tensor *t, int dim, nb_tensor *index, bool select) {
    if (!nbi_arg(fn, t, 0) || !nbi_arg(fn, index, 1)) return NULL;
    if (index->dtype != NB_I64)
        return nbi_error("%s: index must be i64, got %s", fn, nb_dtype_name(index->dtype));
    if (!nbi_check_no_bf16(fn, t)) return NULL;
    if (t->ndim == 0) return nbi_error("%s: cannot index a 0-d tensor", fn);
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    int64_t sh[NB_MAX_DIMS], ist[NB_MAX_DIMS];
    if (select) {
        if (index->ndim != 1)
            return nbi_error("%s: index must be 1-d, got shape %s", fn, NBI_SHAPE(index));
        memcpy(sh, t->shape, sizeof sh);
        sh[d] = index->shape[0];
    } else {
        if (index->ndim != t->ndim)
            return nbi_error("%s: index has %d dims, input has %d", fn, index->ndim, t->ndim);
        for (int i = 0; i < t->ndim; i++) {
            if (i != d && index->shape[i] > t->shape[i])
                return nbi_error("%s: index shape %s exceeds input shape %s at dim %d", fn,
                                 NBI_SHAPE(index), NBI_SHAPE(t), i);
            sh[i] = index->shape[i];
        }
    }
    if (!check_range(fn, index, t->shape[d], dim)) return NULL;
    index_strides(index, d, select, ist);
    nb_tensor *y = nbi_new(fn, t->dtype, t->ndim, sh, false);
    if (!y) return NULL;
    gather_into(y, ist, index, t, d);
    nb_tensor *in[2] = {t, index};
    if (nbi_is_float(t->dtype) && nbi_needs_grad(2, in)) {
        nbi_node *n = nbi_record(y, fn, pick_backward, 2, in);
        if (!n) return nbi_discard(y);
        n->i[0] = d;
        n->i[1] = select;
        nbi_save(n, NBI_SAVE_IN(1)); /* t's values are not needed, the index is */
        n->jvp = pick_jvp;
    }
    return y;
}

nb_tensor *nb_gather(nb_tensor *t, int dim, nb_tensor *index) {
    return pick_op("nb_gather", t, dim, index, false);
}

nb_tensor *nb_index_select(nb_tensor *t, int dim, nb_tensor *index) {
    return pick_op("nb_index_select", t, dim, index, true);
}
