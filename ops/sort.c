/* sort.c: ordering along one dim: nb_sort and nb_topk.
 *
 * Both sort every slice along dim with one stable merge sort: values are
 * keyed as doubles (exact for f32 and f64), NaN above +inf, -0 equal to +0,
 * and equal keys keep their index order whichever direction is asked (as
 * torch.sort(stable=True)). topk is the first k of that order, so its ties
 * go to the lower index first. A topk with k <= len / 8 (sampling's top 40
 * of 50257 logits) selects instead of sorting: a heap of the k first in that
 * order so far (one comparison per element against the heap's last), then
 * the k sorted: the same k in the same order, O(len + k log k log len)
 * rather than a sort of the whole slice. Slices are independent, so they are split
 * across threads whole: the result never depends on the thread count.
 *
 * The gradient puts g back at the picked positions (zeros elsewhere), from
 * the indices the node keeps (node->extra). */
#include "index_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* a sorts strictly before b (ascending: a < b, NaN largest) */
static inline bool key_less(double a, double b) { return !isnan(a) && (isnan(b) || a < b); }

/* The stable order of key[0..n) into ord (tmp: n scratch slots). */
static void merge_sort(const double *key, bool desc, int64_t *ord, int64_t *tmp, int64_t n) {
    for (int64_t i = 0; i < n; i++) ord[i] = i;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                /* take from the right run only when strictly before: stability */
                double a = key[ord[i]], b = key[ord[j]];
                bool right = desc ? key_less(a, b) : key_less(b, a);
                tmp[o++] = right ? ord[j++] : ord[i++];
            }
            while (i < mid) tmp[o++] = ord[i++];
            while (j < hi) tmp[o++] = ord[j++];
        }
        memcpy(ord, tmp, (size_t)n * sizeof *ord);
    }
}

typedef struct {
    nbi_iter it; /* over t's shape with dim set to 1: ops t, values, indices */
    nb_dtype dt;
    int64_t len, k, ts, ys, is; /* slice length, kept, strides along dim */
    const char *pt;
    char *py;
    int64_t *pi;
    bool desc;
    int failed;
} sort_job;

/* Element a comes before element b (a != b) in the stable order: by key,
 * equal keys by index. */
static inline bool before(const double *key, bool desc, int64_t a, int64_t b) {
    double x = key[a], y = key[b];
    if (desc ? key_less(y, x) : key_less(x, y)) return true;
    if (desc ? key_less(x, y) : key_less(y, x)) return false;
    return a < b;
}

/* h[0..n) a heap whose root comes last of its elements: h[i]'s subtree
 * restored */
static void sift_down(const double *key, bool desc, int64_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && before(key, desc, h[c], h[c + 1])) c++;
        if (!before(key, desc, h[i], h[c])) return;
        int64_t t = h[i];
        h[i] = h[c], h[c] = t;
        i = c;
    }
}

static int cmp_index(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ord[0..k) = the first k of key[0..n)'s stable order (1 <= k <= n; tmp: 2k
 * scratch slots, sub: k keys) */
static void select_k(const double *key, bool desc, int64_t *ord, int64_t *tmp, double *sub,
                     int64_t n, int64_t k) {
    int64_t *h = tmp;
    for (int64_t i = 0; i < k; i++) h[i] = i;
    for (int64_t i = k / 2; i-- > 0;) sift_down(key, desc, h, k, i);
    for (int64_t r = k; r < n; r++)
        if (before(key, desc, r, h[0])) {
            h[0] = r;
            sift_down(key, desc, h, k, 0);
        }
    /* in index order, then the stable sort of their keys keeps it among ties */
    qsort(h, (size_t)k, sizeof *h, cmp_index);
    for (int64_t i = 0; i < k; i++) sub[i] = key[h[i]];
    merge_sort(sub, desc, ord, tmp + k, k);
    for (int64_t i = 0; i < k; i++) ord[i] = h[ord[i]];
}

/* x (..., len, ...) -> values, indices (..., k, ...): per slice */
static void sort_span(void *ctx, int64_t lo, int64_t hi) {
    sort_job *j = ctx;
    int64_t n = j->len, k = j->k;
    bool sel = k > 0 && k <= n / 8;
    double *key = malloc((size_t)(n + (sel ? k : 0) + 1) * sizeof *key);
    int64_t *ord = malloc((size_t)(sel ? 3 * k : 2 * n + 1) * sizeof *ord);
    if (!key || !ord) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        free(key);
        free(ord);
        return;
    }
    NBI_FOR_SPAN(&j->it, lo, hi, c, jb, je) {
        for (int64_t s = jb; s < je; s++) {
            int64_t xo = c.off[0] + s * NBI_INNER(&j->it, 0);
            int64_t yo = c.off[1] + s * NBI_INNER(&j->it, 1);
            int64_t io = c.off[2] + s * NBI_INNER(&j->it, 2);
            if (j->dt == NB_F32)
                for (int64_t r = 0; r < n; r++) key[r] = ((const float *)j->pt)[xo + r * j->ts];
            else
                for (int64_t r = 0; r < n; r++) key[r] = ((const double *)j->pt)[xo + r * j->ts];
            if (sel) select_k(key, j->desc, ord, ord + k, key + n, n, k);
            else merge_sort(key, j->desc, ord, ord + n, n);
            for (int64_t r = 0; r < j->k; r++) {
                int64_t src = ord[r];
                j->pi[io + r * j->is] = src;
                if (j->dt == NB_F32)
                    ((float *)j->py)[yo + r * j->ys] = ((const float *)j->pt)[xo + src * j->ts];
                else
                    ((double *)j->py)[yo + r * j->ys] = ((const double *)j->pt)[xo + src * j->ts];
            }
        }
    }
    free(key);
    free(ord);
}

/* Fills y and idx (contiguous, t's shape with k at d); false on out of memory. */
static bool sort_run(const char *fn, const nb_tensor *t, int d, int64_t k, bool desc,
                     nb_tensor *y, nb_tensor *idx) {
    if (y->numel == 0) return true;
    sort_job j = {.dt = t->dtype, .len = t->shape[d], .k = k, .ts = t->strides[d],
                  .ys = y->strides[d], .is = idx->strides[d], .pt = nbi_ptr(t),
                  .py = nbi_ptr(y), .pi = nbi_ptr(idx), .desc = desc};
    int64_t keep[NB_MAX_DIMS];
    memcpy(keep, t->shape, sizeof keep);
    keep[d] = 1;
    const int64_t *st[3] = {t->strides, y->strides, idx->strides};
    nbi_iter_init(&j.it, t->ndim, keep, 3, st);
    int64_t slices = y->numel / k;
    nbi_parallel_for(slices, NBI_GRAIN_HEAVY / (j.len + 1) + 1, sort_span, &j);
    if (j.failed) return nbi_error("%s: out of memory", fn), false;
    return true;
}

/* g (..., k, ...) -> zeros of t's shape with g at the kept indices (a
 * recorded scatter under create_graph); i[0] = dim, i[1] = topk */
static int sort_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (!nbi_wants(n, 0)) return 0;
    const nb_tensor *in = n->in[0];
    if (in->ndim == 0) /* a 0-d sort is the identity */
        gin[0] = nbi_grad_copy("nb_backward", g);
    else
        gin[0] = nbi_scatter(n->i[1] ? "nb_topk's backward (scatter)"
                                     : "nb_sort's backward (scatter)",
                             g, (int)n->i[0], n->extra, NBI_SCATTER_SET, in->ndim, in->shape);
    return gin[0] ? 0 : -1;
}

/* The tangent is t's picked at the same indices. */
static nb_tensor *sort_jvp(nbi_node *n, nb_tensor *const *tin) {
    if (n->in[0]->ndim == 0) return nbi_grad_copy("nb_jvp", tin[0]);
    return nb_gather(tin[0], (int)n->i[0], n->extra);
}

/* The shared body: t sorted along dim, the first k kept. */
static nb_tensor *sort_op(const char *fn, nb_tensor *t, int dim, int64_t k, bool desc,
                          bool topk, nb_tensor **indices) {
    if (indices) *indices = NULL;
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (!nbi_check_float(fn, t)) return NULL;
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    int64_t size = t->ndim ? t->shape[d] : 1;
    if (!topk) k = size;
    if (k < 0 || k > size)
        return nbi_error("%s: k = %lld out of range for dim %d of size %lld", fn, (long long)k,
                         dim, (long long)size);
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    nb_tensor *y, *idx;
    if (t->ndim == 0) { /* torch: the value itself, index 0, for k = 0 too */
        y = nbi_new(fn, t->dtype, 0, sh, false);
        idx = y ? nb_zeros(NB_I64, 0, sh) : NULL;
        if (!idx) return nbi_discard(y);
        nbi_copy_strided(y, t->strides, t);
    } else {
        sh[d] = k;
        y = nbi_new(fn, t->dtype, t->ndim, sh, false);
        idx = y ? nbi_new(fn, NB_I64, t->ndim, sh, false) : NULL;
        if (!idx || !sort_run(fn, t, d, k, desc, y, idx)) {
            nb_free(idx);
            return nbi_discard(y);
        }
    }
    nb_tensor *mine = NULL; /* the caller's copy: the node's own cannot be written to */
    if (indices) {
        mine = nbi_new(fn, NB_I64, idx->ndim, idx->shape, false);
        if (!mine) {
            nb_free(idx);
            return nbi_discard(y);
        }
        nbi_copy_strided(mine, idx->strides, idx);
    }
    if (nbi_needs_grad(1, &t)) {
        nbi_node *n = nbi_record(y, fn, sort_backward, 1, &t);
        if (!n) {
            nb_free(idx);
            nb_free(mine);
            return nbi_discard(y);
        }
        nbi_save(n, 0); /* t's values are not needed: the indices say where */
        n->i[0] = d;
        n->i[1] = topk;
        n->extra = nbi_unscoped(idx);
        n->jvp = sort_jvp;
    } else {
        nb_free(idx);
    }
    if (indices) *indices = mine;
    return y;
}

nb_tensor *nb_sort(nb_tensor *t, int dim, bool descending, nb_tensor **indices) {
    return sort_op("nb_sort", t, dim, 0, descending, false, indices);
}

nb_tensor *nb_topk(nb_tensor *t, int64_t k, int dim, bool largest, bool sorted,
                   nb_tensor **indices) {
    (void)sorted; /* always sorted: the unsorted order torch allows is any order */
    return sort_op("nb_topk", t, dim, k, largest, true, indices);
}
