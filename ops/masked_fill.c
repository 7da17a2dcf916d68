/* masked_fill.c: nb_masked_fill(t, mask, value), PyTorch's out-of-place
 * masked_fill: value where the NB_BOOL mask is true, t elsewhere.
 *
 * t and mask broadcast against each other and the result has the broadcast
 * shape, as torch.Tensor.masked_fill does (a mask with more dims than t makes
 * a bigger result). Attention uses it with a padding mask (B,1,1,Lk), a
 * causal mask (Lq,Lk) or both (B,1,Lq,Lk) on scores (B,H,Lq,Lk), and
 * value = -INFINITY (softmax then gives 0 there). */
#include "ops_internal.h"

/* ------------------------------------------------------------- backward */
/* g (S) any strides, mask broadcast to S -> g with zeros where mask is true,
 * summed back to t's shape. node->in = {t, mask}. */
static int masked_fill_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *t = n->in[0], *mask = n->in[1];
    if (!nbi_wants(n, 0)) return 0;
    nb_tensor *gm = nbi_new(n->op, g->dtype, g->ndim, g->shape, false);
    if (!gm) return -1;
    int64_t mst[NB_MAX_DIMS];
    nbi_broadcast_strides(mask, g->ndim, g->shape, mst);
    const int64_t *st[3] = {gm->strides, g->strides, mst};
    nbi_iter it;
    nbi_iter_init(&it, g->ndim, g->shape, 3, st);
    int64_t s0 = NBI_INNER(&it, 0), s1 = NBI_INNER(&it, 1), s2 = NBI_INNER(&it, 2);
    const bool *pm = nbi_ptr(mask);
    if (g->dtype == NB_F32) {
        float *po = nbi_ptr(gm);
        const float *pg = nbi_ptr(g);
        NBI_FOR_ROWS(&it, c)
            for (int64_t j = 0; j < it.n; j++)
                po[c.off[0] + j * s0] = pm[c.off[2] + j * s2] ? 0.0f : pg[c.off[1] + j * s1];
    } else {
        double *po = nbi_ptr(gm);
        const double *pg = nbi_ptr(g);
        NBI_FOR_ROWS(&it, c)
            for (int64_t j = 0; j < it.n; j++)
                po[c.off[0] + j * s0] = pm[c.off[2] + j * s2] ? 0.0 : pg[c.off[1] + j * s1];
    }
    nb_tensor *gt = nbi_sum_to(gm, t->ndim, t->shape);
    if (!gt) return -1;
    gin[0] = gt;
    return 0;
}

/* -------------------------------------------------------------- forward */
/* t (St), mask (Sm) bool -> out (broadcast(St, Sm)) contiguous. */
nb_tensor *nb_masked_fill(nb_tensor *t, nb_tensor *mask, double value) {
    const char *fn = "nb_masked_fill";
    if (!t || !mask) return nbi_null_input(fn);
    if (!nbi_check_float(fn, t)) return NULL;
    if (mask->dtype != NB_BOOL)
        return nbi_error("%s: mask must be bool, got %s", fn, nb_dtype_name(mask->dtype));
    int nd;
    int64_t shape[NB_MAX_DIMS];
    if (!nbi_broadcast_shape(fn, t->ndim, t->shape, mask->ndim, mask->shape, &nd, shape))
        return NULL;
    nb_tensor *out = nbi_new(fn, t->dtype, nd, shape, false);
    if (!out) return NULL;
    int64_t tst[NB_MAX_DIMS], mst[NB_MAX_DIMS];
    nbi_broadcast_strides(t, nd, shape, tst);
    nbi_broadcast_strides(mask, nd, shape, mst);
    const int64_t *st[3] = {out->strides, tst, mst};
    nbi_iter it;
    nbi_iter_init(&it, nd, shape, 3, st);
    int64_t s0 = NBI_INNER(&it, 0), s1 = NBI_INNER(&it, 1), s2 = NBI_INNER(&it, 2);
    const bool *pm = nbi_ptr(mask);
    if (t->dtype == NB_F32) {
        float *po = nbi_ptr(out), v = (float)value;
        const float *pt = nbi_ptr(t);
        NBI_FOR_ROWS(&it, c)
            for (int64_t j = 0; j < it.n; j++)
                po[c.off[0] + j * s0] = pm[c.off[2] + j * s2] ? v : pt[c.off[1] + j * s1];
    } else {
        double *po = nbi_ptr(out);
        const double *pt = nbi_ptr(t);
        NBI_FOR_ROWS(&it, c)
            for (int64_t j = 0; j < it.n; j++)
                po[c.off[0] + j * s0] = pm[c.off[2] + j * s2] ? value : pt[c.off[1] + j * s1];
    }
    if (nbi_needs_grad(1, &t)) {
        nb_tensor *ins[2] = {t, mask};
        nbi_node *node = nbi_record(out, fn, masked_fill_backward, 2, ins);
        if (!node) return nbi_discard(out);
        node->saved = NBI_SAVE_IN(1); /* backward reads the mask, not t */
        node->d[0] = value;
    }
    return out;
}
