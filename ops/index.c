/* index.c: picking elements by integer index: nb_gather and
 * nb_index_select (the core of embeddings and of cross entropy). Both read
 * t at positions where one dim's coordinate comes from an index tensor; the
 * gradient adds g back into those positions, in a fixed order. */
#include "ops_internal.h"

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
/* the reverse, accumulating: t[..., index, ...] += g (...) */
#define SCATTER_ADD_ROWS(T)                                                            \
    NBI_FOR_ROWS(&p.it, c) {                                                           \
        for (int64_t j = 0; j < p.it.n; j++) {                                         \
            int64_t k = pi[c.off[1] + j * NBI_INNER(&p.it, 1)];                        \
            ((T *)pt)[c.off[2] + j * NBI_INNER(&p.it, 2) + k * p.dim_stride] +=        \
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

/* node: in[0] = t, in[1] = index (version-checked: backward re-reads it);
 * i[0] = dim, i[1] = 1 for index_select */
static int pick_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    const nb_tensor *t = n->in[0]; /* its shape only */
    nb_tensor *idx = nbi_saved_in(n, 1);
    int dim = (int)n->i[0];
    nb_tensor *acc = idx && n->i[1] && dim == 0 && nb_is_contiguous(g) ? nbi_grad_sink(n, 0) : NULL;
    if (acc && select_into(acc, g, idx)) return 0;
    nb_tensor *z = idx ? nb_zeros(g->dtype, t->ndim, t->shape) : NULL;
    if (!z) return -1;
    int64_t ist[NB_MAX_DIMS] = {0};
    if (n->i[1]) ist[dim] = idx->strides[0];
    else memcpy(ist, idx->strides, sizeof ist);
    pick p;
    pick_init(&p, g, g->strides, ist, z, dim);
    const void *po = nbi_ptr(g);
    void *pt = nbi_ptr(z);
    const int64_t *pi = nbi_ptr(idx);
    if (g->dtype == NB_F32) SCATTER_ADD_ROWS(float)
    else SCATTER_ADD_ROWS(double)
    gin[0] = z;
    return 0;
}

static nb_tensor *pick_op(const char *fn, nb_tensor *t, int dim, nb_tensor *index, bool select) {
    if (!nbi_arg(fn, t, 0) || !nbi_arg(fn, index, 1)) return NULL;
    if (index->dtype != NB_I64)
        return nbi_error("%s: index must be i64, got %s", fn, nb_dtype_name(index->dtype));
    if (!nbi_check_no_bf16(fn, t)) return NULL;
    if (t->ndim == 0) return nbi_error("%s: cannot index a 0-d tensor", fn);
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    int64_t sh[NB_MAX_DIMS], ist[NB_MAX_DIMS] = {0};
    if (select) {
        if (index->ndim != 1)
            return nbi_error("%s: index must be 1-d, got shape %s", fn, NBI_SHAPE(index));
        memcpy(sh, t->shape, sizeof sh);
        sh[d] = index->shape[0];
        ist[d] = index->strides[0];
    } else {
        if (index->ndim != t->ndim)
            return nbi_error("%s: index has %d dims, input has %d", fn, index->ndim, t->ndim);
        for (int i = 0; i < t->ndim; i++) {
            if (i != d && index->shape[i] > t->shape[i])
                return nbi_error("%s: index shape %s exceeds input shape %s at dim %d", fn,
                                 NBI_SHAPE(index), NBI_SHAPE(t), i);
            sh[i] = index->shape[i];
            ist[i] = index->strides[i];
        }
    }
    if (!check_range(fn, index, t->shape[d], dim)) return NULL;
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
    }
    return y;
}

nb_tensor *nb_gather(nb_tensor *t, int dim, nb_tensor *index) {
    return pick_op("nb_gather", t, dim, index, false);
}

nb_tensor *nb_index_select(nb_tensor *t, int dim, nb_tensor *index) {
    return pick_op("nb_index_select", t, dim, index, true);
}
