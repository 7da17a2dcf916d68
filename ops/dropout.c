/* dropout.c: nb_dropout(t, p, training, rng), inverted dropout.
 *
 * Element i (its row-major logical index in t, whatever t's strides) is kept
 * iff u(seed, base + i) >= p, where u is the counter-based uniform stream of
 * tensor/rng.c and base is the first of numel draws reserved on rng (NULL =
 * the global generator); kept values are multiplied by 1/(1-p), computed in
 * t's dtype. So the mask depends only on (seed, base, i): not on the strides
 * of t, not on the thread count.
 *
 * No mask tensor is stored for backward. The node keeps just (seed, base, p)
 * in node->i[] / node->d[] and backward regenerates the very same mask from
 * the stream, which is what a counter-based generator makes free: dropout
 * costs no memory beyond its output, unlike a saved bool/float mask of the
 * input's size per dropout layer.
 *
 * Special cases: !training or p == 0 returns a new handle on t (identity
 * gradient, no draws); p == 1 returns zeros (zero gradient, no draws). */
#include "ops_internal.h"

#include <math.h>
#include <string.h>

/* uint64 <-> the int64 slots of a node, bit for bit */
static int64_t to_slot(uint64_t u) {
    int64_t s;
    memcpy(&s, &u, sizeof s);
    return s;
}
static uint64_t from_slot(int64_t s) {
    uint64_t u;
    memcpy(&u, &s, sizeof u);
    return u;
}

/* Row-major walk over one shape with two operands, counting the logical
 * index k of each element: BODY sees k, o0, o1 (offsets in each operand). */
#define FOR_LOGICAL(ndim, shape, st0, st1, BODY)                               \
    do {                                                                       \
        const int64_t *st_[2] = {(st0), (st1)};                                \
        nbi_iter it_;                                                          \
        nbi_iter_init(&it_, (ndim), (shape), 2, st_);                          \
        int64_t i0_ = NBI_INNER(&it_, 0), i1_ = NBI_INNER(&it_, 1), k = 0;     \
        NBI_FOR_ROWS(&it_, c_) {                                               \
            for (int64_t j_ = 0; j_ < it_.n; j_++, k++) {                      \
                int64_t o0 = c_.off[0] + j_ * i0_, o1 = c_.off[1] + j_ * i1_;  \
                BODY                                                           \
            }                                                                  \
        }                                                                      \
    } while (0)

/* dst (S) contiguous <- src (S) any strides, kept by the mask of (seed, base)
 * and scaled; dropped elements are 0. p == 1 drops everything (u < 1). */
static void apply_mask(nb_tensor *dst, const nb_tensor *src, uint64_t seed, uint64_t base,
                       double p) {
    uint64_t key = nbi_rng_key(seed);
    if (dst->dtype == NB_F32) {
        float *pd = nbi_ptr(dst), scale = 1.0f / (float)(1.0 - p);
        const float *ps = nbi_ptr(src);
        FOR_LOGICAL(dst->ndim, dst->shape, dst->strides, src->strides,
                    pd[o0] = nbi_rng_uniform_key(key, base + (uint64_t)k) >= p ? ps[o1] * scale
                                                                          : 0.0f;);
    } else {
        double *pd = nbi_ptr(dst), scale = 1.0 / (1.0 - p);
        const double *ps = nbi_ptr(src);
        FOR_LOGICAL(dst->ndim, dst->shape, dst->strides, src->strides,
                    pd[o0] = nbi_rng_uniform_key(key, base + (uint64_t)k) >= p ? ps[o1] * scale
                                                                          : 0.0;);
    }
}

/* ------------------------------------------------------------- backward */
/* g (S) any strides -> g * mask / (1-p) (S), the mask regenerated from
 * (seed, base) = (node->i[0], node->i[1]) and p = node->d[0]. */
static int dropout_backward(nbi_node *n, nb_tensor *g, nb_tensor **gin) {
    if (!nbi_wants(n, 0)) return 0;
    nb_tensor *gi = nbi_new(n->op, g->dtype, g->ndim, g->shape, n->d[0] >= 1.0);
    if (!gi) return -1;
    if (n->d[0] < 1.0) apply_mask(gi, g, from_slot(n->i[0]), from_slot(n->i[1]), n->d[0]);
    gin[0] = gi;
    return 0;
}

/* -------------------------------------------------------------- forward */
/* t (S) any strides -> (S) contiguous (or an alias of t, see above). */
nb_tensor *nb_dropout(nb_tensor *t, double p, bool training, nb_rng *rng) {
    const char *fn = "nb_dropout";
    if (!t) return nbi_null_input(fn);
    if (!(p >= 0.0 && p <= 1.0)) /* also rejects NaN */
        return nbi_error("%s: p must be in [0, 1], got %g", fn, p);
    if (!nbi_check_float(fn, t)) return NULL;
    if (!training || p == 0.0) return nbi_alias(fn, t);

    nb_tensor *y = nbi_new(fn, t->dtype, t->ndim, t->shape, p >= 1.0);
    if (!y) return NULL;
    uint64_t seed = 0, base = 0;
    if (p < 1.0) {
        seed = (rng ? rng : nb_global_rng())->seed;
        base = nbi_rng_take(rng, (uint64_t)t->numel);
        apply_mask(y, t, seed, base, p);
    }
    if (nbi_needs_grad(1, &t)) {
        nbi_node *node = nbi_record(y, fn, dropout_backward, 1, &t);
        if (!node) return nbi_discard(y);
        node->saved = 0; /* nothing: the mask is regenerated from the stream */
        node->i[0] = to_slot(seed);
        node->i[1] = to_slot(base);
        node->d[0] = p;
    }
    return y;
}
