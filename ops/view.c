/* view.c: ops that return a new view of the same storage (no copy), each
 * with its backward rule, plus nb_reshape and nb_contiguous, which copy only
 * when the strides cannot express the result. */
#include "ops_internal.h"

#include <string.h>

/* y, a view or copy of t that op made, recorded with backward rule bw and
 * tangent rule jvp when t requires grad (*node: the node, or NULL). The
 * rules of this file are made of recorded ops (views, reshapes, sums and the
 * slices' embedding), so they work under create_graph as they are; the
 * tangent of a view is the same view of the tangent. */
static nb_tensor *record_as(const char *op, nb_tensor *t, nb_tensor *y, nbi_backward_fn bw,
                            nbi_jvp_fn jvp, nbi_node **node) {
    if (node) *node = NULL;
    if (!y || !nbi_needs_grad(1, &t)) return y;
    nbi_node *n = nbi_record(y, op, bw, 1, &t);
    if (!n) return nbi_discard(y);
    n->jvp = jvp;
    if (node) *node = n;
    return y;
}

static nb_tensor *record_view(const char *op, nb_tensor *t, int ndim, const int64_t *shape,
                              const int64_t *strides, int64_t offset, nbi_backward_fn bw,
                              nbi_jvp_fn jvp, nbi_node **node) {
    return record_as(op, t, nbi_make_view(t, ndim, shape, strides, offset), bw, jvp, node);
}

/* ------------------------------------------------------------ view/reshape */
/* gradient of any op that only rearranges elements into another shape */
static int reshape_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_reshape(g, n->in[0]->ndim, n->in[0]->shape);
    return gin[0] ? 0 : -1;
}

/* its tangent: the tangent in the output's shape (nb_reshape, since a
 * tangent may have any strides) */
static nb_tensor *reshape_jvp(nbi_node *n, nb_tensor *const *tin) {
    return nb_reshape(tin[0], n->out->ndim, n->out->shape);
}

/* Resolves one -1 in shape against numel; false + message if impossible. */
static bool infer_shape(const char *fn, const nb_tensor *t, int ndim, const int64_t *shape,
                        int64_t *out) {
    if (ndim < 0 || ndim > NB_MAX_DIMS)
        return nbi_error("%s: ndim %d out of range (0..%d)", fn, ndim, NB_MAX_DIMS), false;
    if (ndim > 0 && !shape) return nbi_error("%s: shape is NULL", fn), false;
    int infer = -1;
    int64_t known = 1, nonzero = 1; /* the product, and that of the nonzero sizes: the
                                     * strides of an empty shape, which must fit too */
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (shape[i] < 0)
            return nbi_error("%s: invalid size %lld in shape %s", fn, (long long)shape[i],
                             nbi_shape_str(ndim, shape)), false;
        if (shape[i] && nonzero > INT64_MAX / shape[i])
            return nbi_error("%s: shape %s overflows int64", fn, nbi_shape_str(ndim, shape)),
                   false;
        known *= shape[i];
        nonzero *= shape[i] ? shape[i] : 1;
    }
    if (infer >= 0) {
        if (known == 0 || t->numel % known != 0)
            return nbi_error("%s: shape %s is invalid for input of %lld elements", fn,
                             nbi_shape_str(ndim, shape), (long long)t->numel), false;
        out[infer] = t->numel / known;
        known *= out[infer];
    }
    if (known != t->numel)
        return nbi_error("%s: shape %s is invalid for input of shape %s (%lld elements)", fn,
                         nbi_shape_str(ndim, shape), NBI_SHAPE(t), (long long)t->numel), false;
    return true;
}

/* Strides that show t's elements in (ndim, shape) order without a copy, as
 * PyTorch decides it: each run of t's dims that is contiguous in memory
 * ("chunk") must be split exactly by the new sizes. False if impossible. */
static bool view_strides(const nb_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    if (t->numel == 0 || t->ndim == 0) {
        nbi_contiguous_strides(ndim, shape, strides);
        return true;
    }
    int vd = ndim - 1;
    int64_t base = t->strides[t->ndim - 1], tnumel = 1, vnumel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tnumel *= t->shape[d];
        bool chunk_ends = d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != tnumel * base);
        if (!chunk_ends) continue;
        while (vd >= 0 && (vnumel < tnumel || shape[vd] == 1)) {
            strides[vd] = vnumel * base;
            vnumel *= shape[vd];
            vd--;
        }
        if (vnumel != tnumel) return false;
        if (d > 0) {
            base = t->strides[d - 1];
            tnumel = vnumel = 1;
        }
    }
    return vd == -1;
}

nb_tensor *nb_view(nb_tensor *t, int ndim, const int64_t *shape) {
    const char *fn = "nb_view";
    if (!nbi_arg(fn, t, 0)) return NULL;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    if (!infer_shape(fn, t, ndim, shape, sh)) return NULL;
    if (!view_strides(t, ndim, sh, st))
        return nbi_error("%s: shape %s with strides %s cannot be viewed as %s without a copy "
                         "(e.g. after nb_transpose); use nb_reshape, which copies when needed",
                         fn, NBI_SHAPE(t), nbi_shape_str(t->ndim, t->strides),
                         nbi_shape_str(ndim, sh));
    return record_view(fn, t, ndim, sh, st, t->offset, reshape_backward, reshape_jvp, NULL);
}

nb_tensor *nb_reshape(nb_tensor *t, int ndim, const int64_t *shape) {
    const char *fn = "nb_reshape";
    if (!nbi_arg(fn, t, 0)) return NULL;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    if (!infer_shape(fn, t, ndim, shape, sh)) return NULL;
    if (view_strides(t, ndim, sh, st))
        return record_view(fn, t, ndim, sh, st, t->offset, reshape_backward, reshape_jvp, NULL);
    nb_tensor *y = nbi_new(fn, t->dtype, ndim, sh, false);
    if (!y) return NULL;
    int64_t in_st[NB_MAX_DIMS]; /* copy in t's own shape, then relabel */
    nb_tensor *tmp = nbi_make_view(y, t->ndim, t->shape, y->strides, 0);
    if (!tmp) return nbi_discard(y);
    nbi_contiguous_strides(t->ndim, t->shape, in_st);
    memcpy(tmp->strides, in_st, sizeof in_st);
    nbi_copy_strided(tmp, t->strides, t);
    nb_free(tmp);
    return record_as(fn, t, y, reshape_backward, reshape_jvp, NULL);
}

/* The rules of nbi_alias and nb_contiguous: neither changes an element. */
static int identity_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = g;
    return 0;
}

static nb_tensor *identity_jvp(nbi_node *n, nb_tensor *const *tin) {
    (void)n;
    return nbi_recorded_alias(tin[0]);
}

nb_tensor *nbi_alias(const char *op, nb_tensor *t) {
    return record_view(op, t, t->ndim, t->shape, t->strides, t->offset, identity_backward,
                       identity_jvp, NULL);
}

nb_tensor *nb_contiguous(nb_tensor *t) {
    const char *fn = "nb_contiguous";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (nb_is_contiguous(t)) return nbi_alias(fn, t);
    nb_tensor *y = nbi_new_like(fn, t, false);
    if (!y) return NULL;
    nbi_copy_strided(y, t->strides, t);
    return record_as(fn, t, y, identity_backward, identity_jvp, NULL);
}

/* ---------------------------------------------------- transpose / permute */
static int permute_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    int inv[NB_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) inv[n->i[i]] = i;
    gin[0] = nb_permute(g, g->ndim, inv);
    return gin[0] ? 0 : -1;
}

static nb_tensor *permute_jvp(nbi_node *n, nb_tensor *const *tin) {
    int perm[NB_MAX_DIMS];
    for (int i = 0; i < tin[0]->ndim; i++) perm[i] = (int)n->i[i];
    return nb_permute(tin[0], tin[0]->ndim, perm);
}

nb_tensor *nb_permute(nb_tensor *t, int ndim, const int *dims) {
    const char *fn = "nb_permute";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (ndim && !dims) return nbi_error("%s: dims is NULL", fn);
    if (ndim != t->ndim) return nbi_error("%s: got %d dims for a %d-d tensor", fn, ndim, t->ndim);
    int64_t sh[NB_MAX_DIMS] = {0}, st[NB_MAX_DIMS] = {0};
    int perm[NB_MAX_DIMS];
    bool seen[NB_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        int d = nbi_dim(fn, dims[i], ndim);
        if (d < 0) return NULL;
        if (seen[d]) return nbi_error("%s: dim %d appears twice", fn, d);
        seen[d] = true;
        perm[i] = d;
        sh[i] = t->shape[d];
        st[i] = t->strides[d];
    }
    nbi_node *n;
    nb_tensor *y = record_view(fn, t, ndim, sh, st, t->offset, permute_backward, permute_jvp, &n);
    if (n) for (int i = 0; i < ndim; i++) n->i[i] = perm[i];
    return y;
}

nb_tensor *nb_transpose(nb_tensor *t, int dim0, int dim1) {
    const char *fn = "nb_transpose";
    if (!nbi_arg(fn, t, 0)) return NULL;
    int a = nbi_dim(fn, dim0, t->ndim), b;
    if (a < 0 || (b = nbi_dim(fn, dim1, t->ndim)) < 0) return NULL;
    if (t->ndim == 0) return nbi_alias(fn, t);
    int perm[NB_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        sh[i] = t->shape[perm[i]];
        st[i] = t->strides[perm[i]];
    }
    nbi_node *n;
    nb_tensor *y =
        record_view(fn, t, t->ndim, sh, st, t->offset, permute_backward, permute_jvp, &n);
    if (n) for (int i = 0; i < t->ndim; i++) n->i[i] = perm[i];
    return y;
}

/* ---------------------------------------------------- unsqueeze / squeeze */
nb_tensor *nb_unsqueeze(nb_tensor *t, int dim) {
    const char *fn = "nb_unsqueeze";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (t->ndim == NB_MAX_DIMS)
        return nbi_error("%s: tensor already has the maximum of %d dims", fn, NB_MAX_DIMS);
    if (dim < -(t->ndim + 1) || dim > t->ndim)
        return nbi_error("%s: dim %d out of range for a %d-d tensor (expected %d..%d)", fn, dim,
                         t->ndim, -(t->ndim + 1), t->ndim);
    int d = dim < 0 ? dim + t->ndim + 1 : dim;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = j < t->ndim ? t->strides[j] * t->shape[j] : 1;
            continue;
        }
        sh[i] = t->shape[j];
        st[i] = t->strides[j++];
    }
    return record_view(fn, t, t->ndim + 1, sh, st, t->offset, reshape_backward, reshape_jvp,
                       NULL);
}

nb_tensor *nb_squeeze(nb_tensor *t, int dim) {
    const char *fn = "nb_squeeze";
    if (!nbi_arg(fn, t, 0)) return NULL;
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    if (t->ndim == 0 || t->shape[d] != 1) return nbi_alias(fn, t);
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d) continue;
        sh[j] = t->shape[i];
        st[j++] = t->strides[i];
    }
    return record_view(fn, t, t->ndim - 1, sh, st, t->offset, reshape_backward, reshape_jvp,
                       NULL);
}

/* ------------------------------------------------------------------ expand */
static int expand_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nbi_sum_to(g, n->in[0]->ndim, n->in[0]->shape);
    return gin[0] ? 0 : -1;
}

/* the tangent expanded as the input was */
static nb_tensor *expand_jvp(nbi_node *n, nb_tensor *const *tin) {
    return nb_expand(tin[0], n->out->ndim, n->out->shape);
}

nb_tensor *nb_expand(nb_tensor *t, int ndim, const int64_t *shape) {
    const char *fn = "nb_expand";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (ndim < t->ndim || ndim > NB_MAX_DIMS || (ndim && !shape))
        return nbi_error("%s: cannot expand a %d-d tensor to %d dims", fn, t->ndim, ndim);
    int lead = ndim - t->ndim;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape[i];
        if (want < -1)
            return nbi_error("%s: invalid size %lld at dim %d of %s", fn, (long long)want, i,
                             nbi_shape_str(ndim, shape));
        if (j < 0) {
            if (want < 0)
                return nbi_error("%s: size %lld is invalid for new leading dim %d", fn,
                                 (long long)want, i);
            sh[i] = want;
            st[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            sh[i] = t->shape[j];
            st[i] = t->strides[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            return nbi_error("%s: cannot expand shape %s to %s (dim %d: %lld is not 1)", fn,
                             NBI_SHAPE(t), nbi_shape_str(ndim, shape), i,
                             (long long)t->shape[j]);
        }
    }
    if (nbi_shape_numel(ndim, sh) < 0)
        return nbi_error("%s: shape %s overflows int64", fn, nbi_shape_str(ndim, sh));
    return record_view(fn, t, ndim, sh, st, t->offset, expand_backward, expand_jvp, NULL);
}

/* ------------------------------------------------------------ narrow/select */
/* A slice's node holds i[0] = dim, i[1] = start, i[2] = length (-1: a
 * select of index start). Its gradient embeds g into zeros of the input's
 * shape; that embedding is recorded under create_graph as an op of its own,
 * whose node holds the same i[] (and whose rules are the slice's, swapped). */
static nb_tensor *slice_of(const nbi_node *n, nb_tensor *t) {
    int dim = (int)n->i[0];
    return n->i[2] < 0 ? nb_select(t, dim, n->i[1]) : nb_narrow(t, dim, n->i[1], n->i[2]);
}

static nb_tensor *embed(const nbi_node *n, nb_tensor *g, int ndim, const int64_t *shape);

static int embed_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = slice_of(n, g);
    return gin[0] ? 0 : -1;
}

static nb_tensor *embed_jvp(nbi_node *n, nb_tensor *const *tin) {
    return embed(n, tin[0], n->out->ndim, n->out->shape);
}

/* g (the slice's shape) -> zeros of (ndim, shape) with g written into the
 * slice n names; recorded when g requires grad (a create_graph backward). */
static nb_tensor *embed(const nbi_node *n, nb_tensor *g, int ndim, const int64_t *shape) {
    nb_tensor *z = nb_zeros(g->dtype, ndim, shape);
    if (!z) return NULL;
    nb_tensor *part = slice_of(n, z);
    if (!part || nb_copy_into(part, g) != 0) return NULL;
    if (!nbi_needs_grad(1, &g)) return z;
    const char *op = n->i[2] < 0 ? "nb_select's backward (embed)" : "nb_narrow's backward (embed)";
    nbi_node *e = nbi_record(z, op, embed_backward, 1, &g);
    if (!e) return nbi_discard(z);
    memcpy(e->i, n->i, 3 * sizeof *e->i);
    e->jvp = embed_jvp;
    return z;
}

/* In a plain backward, when the input's gradient is already summed (q, k
 * and v narrowed from one qkv: the second and third slices), g is added
 * into that sum's slice in place (nbi_grad_sink) rather than embedded into
 * zeros the input's size and added whole: in the slice the same one
 * addition per element; outside it the sum is left as it was (adding the
 * zeros changed nothing but a -0 into +0). */
static int slice_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *acc = nbi_create_graph() ? NULL : nbi_grad_sink(n, 0);
    nb_tensor *part = acc ? slice_of(n, acc) : NULL;
    if (part) {
        nbi_add_into(part, g);
        nb_free(part);
        return 0;
    }
    gin[0] = embed(n, g, n->in[0]->ndim, n->in[0]->shape);
    return gin[0] ? 0 : -1;
}

static nb_tensor *slice_jvp(nbi_node *n, nb_tensor *const *tin) { return slice_of(n, tin[0]); }

nb_tensor *nb_narrow(nb_tensor *t, int dim, int64_t start, int64_t length) {
    const char *fn = "nb_narrow";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (t->ndim == 0) return nbi_error("%s: cannot narrow a 0-d tensor", fn);
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    int64_t size = t->shape[d], given = start;
    if (start < 0) start += size;
    if (start < 0 || length < 0 || start > size || length > size - start)
        return nbi_error("%s: start %lld and length %lld out of range for dim %d of size %lld",
                         fn, (long long)given, (long long)length, dim, (long long)size);
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] = length;
    nbi_node *n;
    nb_tensor *y = record_view(fn, t, t->ndim, sh, t->strides, t->offset + start * t->strides[d],
                               slice_backward, slice_jvp, &n);
    if (n) {
        n->i[0] = d;
        n->i[1] = start;
        n->i[2] = length;
    }
    return y;
}

nb_tensor *nb_select(nb_tensor *t, int dim, int64_t index) {
    const char *fn = "nb_select";
    if (!nbi_arg(fn, t, 0)) return NULL;
    if (t->ndim == 0) return nbi_error("%s: cannot select from a 0-d tensor", fn);
    int d = nbi_dim(fn, dim, t->ndim);
    if (d < 0) return NULL;
    int64_t size = t->shape[d];
    if (index < -size || index >= size)
        return nbi_error("%s: index %lld out of range for dim %d of size %lld", fn,
                         (long long)index, dim, (long long)size);
    if (index < 0) index += size;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d) continue;
        sh[j] = t->shape[i];
        st[j++] = t->strides[i];
    }
    nbi_node *n;
    nb_tensor *y = record_view(fn, t, t->ndim - 1, sh, st, t->offset + index * t->strides[d],
                               slice_backward, slice_jvp, &n);
    if (n) {
        n->i[0] = d;
        n->i[1] = index;
        n->i[2] = -1;
    }
    return y;
}
