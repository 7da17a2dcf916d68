/* attention.c: scaled dot-product attention, built only from public ops.
 *
 *   q (..., Lq, D), k (..., Lk, D)  -> scores  = (q / sqrt(D)) · kᵀ (..., Lq, Lk)
 *   keep_mask broadcast to scores   -> scores  = -inf where the mask is false
 *   softmax over the last dim       -> weights                      (..., Lq, Lk)
 *   dropout(weights)                -> weights (what weights_out receives)
 *   weights (..., Lq, Lk) · v (..., Lk, Dv) -> out                  (..., Lq, Dv)
 *
 * e.g. q (B,H,Lq,D), k (B,H,Lk,D) -> scores (B,H,Lq,Lk); v (B,H,Lk,Dv) -> out (B,H,Lq,Dv).
 *
 * kᵀ is nb_transpose of k's last two dims: a view, which nb_matmul reads in
 * place (no copy). The batch dims (...) of q, k and v broadcast as in
 * nb_matmul. The keep mask (true = may attend) broadcasts to the scores'
 * shape, e.g. (B,1,1,Lk) padding, (Lq,Lk) causal, (B,1,Lq,Lk) both; it must
 * not make the scores bigger (nb_masked_fill alone would broadcast the
 * result up to a mask of more or larger dims), so that is an error here.
 *
 * A row whose keys are all masked is all -inf, and nb_softmax gives zeros
 * there (not NaN, and zero gradient): that query attends to nothing, its
 * output row is zero and it passes no gradient. PyTorch gives NaN there. */
#include <math.h>

#include "nn_internal.h"


/* The broadcast of two batch shapes (all but the last two dims) into out;
 * false when they do not broadcast. */
static bool batch_broadcast(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                            int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t x = i < n - na ? 1 : a[i - (n - na)], y = i < n - nb ? 1 : b[i - (n - nb)];
        if (x != y && x != 1 && y != 1) return false;
        out[i] = x == 1 ? y : x;
    }
    *nout = n;
    return true;
}

static nb_tensor *attention_body(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *keep_mask,
                        double dropout_p, bool training, nb_rng *rng, nb_tensor **weights_out) {
    const char *fn = "nb_attention";
    char sq[128], sk[128], sv[128], sm[128], ss[128];
    if (weights_out) *weights_out = NULL;
    if (!nn_input(fn, q, 0) || !nn_input(fn, k, 1) || !nn_input(fn, v, 2) ||
        !nn_opt_input(fn, keep_mask, 3))
        return NULL;

    if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) /* also rejects NaN */
        return nn_error("%s: dropout_p must be in [0, 1], got %g", fn, dropout_p);

    /* ---- shapes: q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) */
    int nq = nb_ndim(q), nk = nb_ndim(k), nv = nb_ndim(v);
    if (nq < 2 || nk < 2 || nv < 2)
        return nn_error("%s: q, k and v must be at least 2-d (..., L, D), got q %s, k %s, v %s",
                        fn, NN_SHAPE(sq, q), NN_SHAPE(sk, k), NN_SHAPE(sv, v));
    nb_dtype dt = nb_dtype_of(q);
    if (dt != NB_F32 && dt != NB_F64)
        return nn_error("%s: q must be floating (f32 or f64), got %s", fn, nb_dtype_name(dt));
    if (nb_dtype_of(k) != dt || nb_dtype_of(v) != dt)
        return nn_error("%s: q, k and v must have one dtype, got %s, %s and %s", fn,
                        nb_dtype_name(dt), nb_dtype_name(nb_dtype_of(k)),
                        nb_dtype_name(nb_dtype_of(v)));
    const int64_t *qs = nb_shape(q), *ks = nb_shape(k), *vs = nb_shape(v);
    int64_t Lq = qs[nq - 2], D = qs[nq - 1], Lk = ks[nk - 2];
    if (ks[nk - 1] != D)
        return nn_error("%s: q %s and k %s must have the same last dim D (%lld != %lld)", fn,
                        NN_SHAPE(sq, q), NN_SHAPE(sk, k), (long long)D, (long long)ks[nk - 1]);
    if (D == 0)
        return nn_error("%s: q %s and k %s have last dim 0: nothing to compare (the scale "
                        "1/sqrt(D) is undefined)", fn, NN_SHAPE(sq, q), NN_SHAPE(sk, k));
    if (vs[nv - 2] != Lk)
        return nn_error("%s: k %s and v %s must have the same length Lk, dim -2 (%lld != %lld)",
                        fn, NN_SHAPE(sk, k), NN_SHAPE(sv, v), (long long)Lk, (long long)vs[nv - 2]);

    /* the scores' shape (broadcast(q..., k...), Lq, Lk), and v's batch dims */
    int ns, no;
    int64_t sshape[NB_MAX_DIMS], oshape[NB_MAX_DIMS];
    if (!batch_broadcast(nq - 2, qs, nk - 2, ks, &ns, sshape))
        return nn_error("%s: the batch dims of q %s and k %s cannot be broadcast together", fn,
                        NN_SHAPE(sq, q), NN_SHAPE(sk, k));
    if (!batch_broadcast(ns, sshape, nv - 2, vs, &no, oshape))
        return nn_error("%s: the batch dims of v %s cannot be broadcast with those of q %s and "
                        "k %s", fn, NN_SHAPE(sv, v), NN_SHAPE(sq, q), NN_SHAPE(sk, k));
    sshape[ns++] = Lq;
    sshape[ns++] = Lk;

    /* ---- the keep mask must broadcast to the scores' shape, unchanged */
    if (keep_mask) {
        if (nb_dtype_of(keep_mask) != NB_BOOL)
            return nn_error("%s: keep_mask must be bool (true = may attend), got %s %s", fn,
                            nb_dtype_name(nb_dtype_of(keep_mask)), NN_SHAPE(sm, keep_mask));
        int nm = nb_ndim(keep_mask);
        const int64_t *ms = nb_shape(keep_mask);
        bool ok = nm <= ns;
        for (int i = 0; ok && i < nm; i++) {
            int64_t m = ms[nm - 1 - i], s = sshape[ns - 1 - i];
            ok = m == s || m == 1;
        }
        if (!ok)
            return nn_error("%s: keep_mask %s cannot be broadcast to the scores' shape %s "
                            "(batch..., Lq, Lk) of q %s and k %s", fn, NN_SHAPE(sm, keep_mask),
                            nn_shape_str(ss, sizeof ss, ns, sshape), NN_SHAPE(sq, q), NN_SHAPE(sk, k));
    }

    /* ---- (q / sqrt(D)) (..., Lq, D) · kᵀ (..., D, Lk) -> scores (..., Lq, Lk).
     * Scaling q rather than the scores touches D/Lk as many elements (for a
     * power-of-4 D the result is bitwise the same). Each (..., Lq, Lk)
     * intermediate is freed as soon as the next one exists: the graph keeps
     * only what backward reads (softmax's output, the weights for the last
     * matmul), so the scores and masked scores cost no memory after. */
    nb_tensor *qs_ = nb_mul_scalar(q, 1.0 / sqrt((double)D));
    nb_tensor *scores = nb_matmul(qs_, nb_transpose(k, -2, -1));
    nb_free(qs_);
    /* -inf where the keep mask is false: softmax gives those keys weight 0 */
    if (keep_mask) {
        nb_tensor *drop = nb_logical_not(keep_mask);
        nb_tensor *masked = nb_masked_fill(scores, drop, -INFINITY);
        nb_free(drop);
        nb_free(scores);
        scores = masked;
    }
    /* softmax over the keys; then dropout on the weights (identity unless training) */
    nb_tensor *probs = nb_softmax(scores, -1);
    nb_free(scores);
    nb_tensor *weights = nb_dropout(probs, dropout_p, training, rng);
    if (weights != probs) nb_free(probs);
    /* weights (..., Lq, Lk) · v (..., Lk, Dv) -> (..., Lq, Dv) */
    nb_tensor *out = nb_matmul(weights, v);
    if (out && weights_out) *weights_out = weights;
    else nb_free(weights);
    return out;
}

nb_tensor *nb_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *keep_mask,
                        double dropout_p, bool training, nb_rng *rng, nb_tensor **weights_out) {
    nn_enter();
    return nn_leave("nb_attention", attention_body(q, k, v, keep_mask, dropout_p, training, rng, weights_out));
}
