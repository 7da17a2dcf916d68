/* shape.c: ops that build a new tensor out of others: nb_cat, nb_stack and
 * nb_to. */
#include "ops_internal.h"

#include <stdlib.h>
#include <string.h>

/* The tangents of node n's inputs, zeros where one is NULL (in the current
 * scope, like the tangents); false on error. */
static bool tangents_or_zeros(const nbi_node *n, nb_tensor *const *tin, nb_tensor **t) {
    for (int k = 0; k < n->nin; k++) {
        const nb_tensor *in = n->in[k];
        t[k] = tin[k] ? tin[k] : nb_zeros(n->out->dtype, in->ndim, in->shape);
        if (!t[k]) return false;
    }
    return true;
}

/* The tangent of a cat or stack: the same op of the inputs' tangents. */
static nb_tensor *joined_jvp(nbi_node *n, nb_tensor *const *tin,
                             nb_tensor *(*op)(nb_tensor *const *, int, int)) {
    nb_tensor *inline_t[NBI_NODE_INLINE], **t = inline_t;
    if (n->nin > NBI_NODE_INLINE && !(t = malloc((size_t)n->nin * sizeof *t)))
        return nbi_error("%s: out of memory for the tangents of %d inputs", n->op, n->nin);
    nb_tensor *y = tangents_or_zeros(n, tin, t) ? op(t, n->nin, (int)n->i[0]) : NULL;
    if (t != inline_t) free(t);
    return y;
}

/* ------------------------------------------------------------------- cat */
/* g (..., sum of sizes, ...) -> one slice per input along dim i[0] */
static int cat_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    int dim = (int)n->i[0];
    int64_t start = 0;
    for (int k = 0; k < n->nin; k++) {
        int64_t len = n->in[k]->shape[dim];
        if (nbi_wants(n, k) && !(gin[k] = nb_narrow(g, dim, start, len))) return -1;
        start += len;
    }
    return 0;
}

static nb_tensor *cat_jvp(nbi_node *n, nb_tensor *const *tin) {
    return joined_jvp(n, tin, nb_cat);
}

nb_tensor *nb_cat(nb_tensor *const *list, int n, int dim) {
    const char *fn = "nb_cat";
    if (!list || n <= 0) return nbi_error("%s: needs at least one tensor (n = %d)", fn, n);
    for (int k = 0; k < n; k++)
        if (!nbi_arg(fn, list[k], k)) return NULL;
    const nb_tensor *a = list[0];
    if (a->ndim == 0) return nbi_error("%s: cannot concatenate 0-d tensors", fn);
    int d = nbi_dim(fn, dim, a->ndim);
    if (d < 0) return NULL;
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, a->shape, sizeof sh);
    sh[d] = 0;
    for (int k = 0; k < n; k++) {
        const nb_tensor *t = list[k];
        if (!nbi_check_same_dtype(fn, a, t)) return NULL;
        bool ok = t->ndim == a->ndim;
        for (int i = 0; ok && i < a->ndim; i++) ok = i == d || t->shape[i] == a->shape[i];
        if (!ok)
            return nbi_error("%s: tensor %d has shape %s, expected %s except in dim %d", fn, k,
                             NBI_SHAPE(t), NBI_SHAPE(a), d);
        if (sh[d] > INT64_MAX - t->shape[d])
            return nbi_error("%s: the sizes along dim %d pass INT64_MAX: tensor %d's %lld after "
                             "%lld",
                             fn, d, k, (long long)t->shape[d], (long long)sh[d]);
        sh[d] += t->shape[d];
    }
    nb_tensor *y = nbi_new(fn, a->dtype, a->ndim, sh, false);
    if (!y) return NULL;
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        const nb_tensor *t = list[k];
        int64_t part_sh[NB_MAX_DIMS];
        memcpy(part_sh, sh, sizeof part_sh);
        part_sh[d] = t->shape[d];
        nb_tensor *part = nbi_make_view(y, y->ndim, part_sh, y->strides,
                                        start * y->strides[d]);
        if (!part) return nbi_discard(y);
        nbi_copy_strided(part, t->strides, t);
        nb_free(part);
        start += t->shape[d];
    }
    if (nbi_needs_grad(n, list)) {
        nbi_node *node = nbi_record(y, fn, cat_backward, n, list);
        if (!node) return nbi_discard(y);
        node->i[0] = d;
        node->jvp = cat_jvp;
    }
    return y;
}

/* ----------------------------------------------------------------- stack */
/* g (..., n, ...) -> slice k along the new dim i[0] for input k */
static int stack_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    int dim = (int)n->i[0];
    for (int k = 0; k < n->nin; k++)
        if (nbi_wants(n, k) && !(gin[k] = nb_select(g, dim, k))) return -1;
    return 0;
}

static nb_tensor *stack_jvp(nbi_node *n, nb_tensor *const *tin) {
    return joined_jvp(n, tin, nb_stack);
}

/* n tensors (S) -> (S with n inserted at dim) */
nb_tensor *nb_stack(nb_tensor *const *list, int n, int dim) {
    const char *fn = "nb_stack";
    if (!list || n <= 0) return nbi_error("%s: needs at least one tensor (n = %d)", fn, n);
    for (int k = 0; k < n; k++)
        if (!nbi_arg(fn, list[k], k)) return NULL;
    const nb_tensor *a = list[0];
    if (a->ndim >= NB_MAX_DIMS)
        return nbi_error("%s: result would have more than %d dims", fn, NB_MAX_DIMS);
    int d = nbi_dim(fn, dim, a->ndim + 1);
    if (d < 0) return NULL;
    for (int k = 1; k < n; k++) {
        const nb_tensor *t = list[k];
        if (!nbi_check_same_dtype(fn, a, t)) return NULL;
        if (!nbi_same_shape(a, t))
            return nbi_error("%s: tensor %d has shape %s, expected %s", fn, k, NBI_SHAPE(t),
                             NBI_SHAPE(a));
    }
    int64_t sh[NB_MAX_DIMS];
    for (int i = 0, j = 0; i <= a->ndim; i++) sh[i] = i == d ? n : a->shape[j++];
    nb_tensor *y = nbi_new(fn, a->dtype, a->ndim + 1, sh, false);
    if (!y) return NULL;
    int64_t part_st[NB_MAX_DIMS];
    for (int i = 0, j = 0; i <= a->ndim; i++)
        if (i != d) part_st[j++] = y->strides[i];
    for (int k = 0; k < n; k++) {
        nb_tensor *part = nbi_make_view(y, a->ndim, a->shape, part_st, k * y->strides[d]);
        if (!part) return nbi_discard(y);
        nbi_copy_strided(part, list[k]->strides, list[k]);
        nb_free(part);
    }
    if (nbi_needs_grad(n, list)) {
        nbi_node *node = nbi_record(y, fn, stack_backward, n, list);
        if (!node) return nbi_discard(y);
        node->i[0] = d;
        node->jvp = stack_jvp;
    }
    return y;
}

/* -------------------------------------------------------------------- to */
static int to_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_to(g, n->in[0]->dtype);
    return gin[0] ? 0 : -1;
}

static nb_tensor *to_jvp(nbi_node *n, nb_tensor *const *tin) {
    return nb_to(tin[0], n->out->dtype);
}

nb_tensor *nb_to(nb_tensor *t, nb_dtype dtype) {
    const char *fn = "nb_to";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if ((unsigned)dtype > NB_BF16) return nbi_error("%s: unknown dtype %d", fn, (int)dtype);
    if (dtype == t->dtype) return nbi_alias(fn, t);
    nb_tensor *y = nbi_new(fn, dtype, t->ndim, t->shape, false);
    if (!y) return NULL;
    nbi_copy_strided(y, t->strides, t);
    if (nbi_is_diff(dtype) && nbi_is_diff(t->dtype) && nbi_needs_grad(1, &t)) {
        nbi_node *node = nbi_record(y, fn, to_backward, 1, &t);
        if (!node) return nbi_discard(y);
        node->jvp = to_jvp;
    }
    return y;
}
