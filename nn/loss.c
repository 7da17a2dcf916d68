/* loss.c: cross entropy, as torch.nn.CrossEntropyLoss with mean reduction,
 * ignore_index and label_smoothing, composed from public ops:
 *   logp   = log_softmax(logits)                      (N, C)
 *   loss_i = (1 - e) * -logp[i, t_i] + e * -mean_c logp[i, c]
 *   loss   = sum of loss_i over rows with t_i != ignore_index / their count
 * (0 / 0 = nan when every row is ignored, as torch); a row of logits that
 * are all -inf costs +inf. */
#include <math.h>

#include "nn_internal.h"


/* The first target (1-d NB_I64, any stride) outside [0, c) that is not
 * ignore; false when all are fine. */
static bool first_bad_target(nb_tensor *t, int64_t c, int64_t ignore, int64_t *bad) {
    const int64_t *p = nb_data(t);
    int64_t n = nb_shape(t)[0], st = nb_strides(t)[0];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = p[i * st];
        if (v != ignore && (v < 0 || v >= c)) return *bad = v, true;
    }
    return false;
}

/* logits (N, C), targets NB_I64 (N) -> () */
static nb_tensor *cross_entropy_body(nb_tensor *logits, nb_tensor *targets, int64_t ignore_index,
                            double label_smoothing) {
    const char *fn = "nb_cross_entropy";
    char b1[128];
    if (!nn_input(fn, logits, 0) || !nn_input(fn, targets, 1)) return NULL;
    nb_dtype dt = nb_dtype_of(logits);
    if (dt != NB_F32 && dt != NB_F64)
        return nn_error("%s: logits must be floating (f32 or f64), got %s", fn, nb_dtype_name(dt));
    if (nb_ndim(logits) != 2)
        return nn_error("%s: logits must be 2-d (N, C), got shape %s", fn,
                        NN_SHAPE(b1, logits));
    int64_t n = nb_shape(logits)[0], c = nb_shape(logits)[1];
    if (c < 1) return nn_error("%s: logits have no classes (C = 0)", fn);
    if (nb_dtype_of(targets) != NB_I64)
        return nn_error("%s: targets must be i64 class indices, got %s", fn,
                        nb_dtype_name(nb_dtype_of(targets)));
    if (nb_ndim(targets) != 1 || nb_shape(targets)[0] != n)
        return nn_error("%s: targets must have shape (%lld) to match logits (%lld,%lld), got %s",
                        fn, (long long)n, (long long)n, (long long)c,
                        NN_SHAPE(b1, targets));
    if (!(label_smoothing >= 0 && label_smoothing <= 1))
        return nn_error("%s: label_smoothing must be in [0, 1], got %g", fn, label_smoothing);
    int64_t bad;
    if (first_bad_target(targets, c, ignore_index, &bad))
        return nn_error("%s: target %lld out of range for %lld classes (valid: 0..%lld, or "
                        "ignore_index %lld)", fn, (long long)bad, (long long)c,
                        (long long)c - 1, (long long)ignore_index);

    nb_tensor *logp = nb_log_softmax(logits, 1);
    nb_tensor *valid = nb_ne(targets, nb_from_data(NB_I64, 0, NULL, &ignore_index));
    /* ignored rows gather class 0 (always valid), then count for nothing */
    nb_tensor *safe = nb_where(valid, targets, nb_zeros(NB_I64, 0, NULL));
    nb_tensor *nll = nb_neg(nb_squeeze(nb_gather(logp, 1, nb_unsqueeze(safe, 1)), 1));
    nb_tensor *row = nll;
    if (label_smoothing > 0) {
        nb_tensor *smooth = nb_neg(nb_mean(logp, 1, false));
        row = nb_add(nb_mul_scalar(nll, 1 - label_smoothing),
                     nb_mul_scalar(smooth, label_smoothing));
    }
    /* A row whose logits are all -inf gives every class, the target too,
     * probability 0: its loss is +inf (log_softmax's zeros there would read
     * as a perfect prediction; PyTorch gives NaN). */
    nb_tensor *dead = nb_eq(nb_max(nb_detach(logits), 1, false), nb_scalar(dt, -INFINITY));
    row = nb_where(dead, nb_scalar(dt, INFINITY), row);
    /* where, not a product with the mask: an ignored row may be inf */
    row = nb_where(valid, row, nb_scalar(dt, 0));
    nb_tensor *count = nb_sum_all(nb_to(valid, dt));
    return nb_div(nb_sum_all(row), count);
}

nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *targets, int64_t ignore_index,
                            double label_smoothing) {
    nn_enter();
    return nn_leave("nb_cross_entropy", cross_entropy_body(logits, targets, ignore_index, label_smoothing));
}
