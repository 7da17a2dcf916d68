/* loss.c: cross entropy, as torch.nn.CrossEntropyLoss with mean reduction,
 * ignore_index and label_smoothing:
 *   logp   = log_softmax(logits)                      (N, C)
 *   loss_i = (1 - e) * -logp[i, t_i] + e * -mean_c logp[i, c]
 *   loss   = sum of loss_i over rows with t_i != ignore_index / their count
 * (0 / 0 = nan when every row is ignored, as torch); a row of logits that
 * are all -inf costs +inf. nb_log_softmax, then one custom function
 * (nb_function) for the rest: GPT-2's 50,257 classes made the composed form
 * (gather, where, a dense one-hot gradient) a tenth of a training step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../nn_internal.h"


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

/* ------------------------------------------------------- the custom function
 * Inputs: the logits, the targets and logp = nb_log_softmax(logits), a
 * recorded op: logp is an input so that, when the gradient is recorded
 * (create_graph), it comes back with its history through log_softmax to the
 * logits. The gradient goes to the logits directly, none to logp (so
 * log_softmax's backward never runs):
 *   dlogits[i, c] = s * (softmax[i, c] - e / C - (1 - e) [c == t_i]),
 * s = g / count, 0 on ignored and dead rows; the fused pass computes it from
 * exp(logp), the recorded form (create_graph) from nabla ops on logp.
 * Forward: per row
 *   loss_i = (1 - e) * -logp[i, t_i] + e * -mean_c logp[i, c]
 * (+inf when the row's logits are all -inf), summed over the rows that are
 * not ignored in row order, in double, divided by their count. It saves
 * logp, the targets, the dead rows and the count. */
typedef struct {
    int64_t ignore;
    double smoothing;
} ce_args;

enum { CE_LOGITS, CE_TARGETS, CE_LOGP };

typedef struct {
    const void *logp, *logits;
    const int64_t *tgt;
    int64_t tst, C, ignore;
    double e;
    double *loss; /* per row */
    bool *dead;
    void *grad;   /* backward: exp(logp), turned into dlogits in place */
    double scale;
    bool f64;
} ce_job;

#define CE_ROWS(T)                                                                     \
    for (int64_t r = lo; r < hi; r++) {                                                \
        int64_t t = j->tgt[r * j->tst];                                                \
        j->dead[r] = false;                                                            \
        if (t == j->ignore) { j->loss[r] = 0; continue; }                              \
        const T *lp = (const T *)j->logp + r * C, *x = (const T *)j->logits + r * C;   \
        double nll = -(double)lp[t], smooth = 0;                                       \
        if (j->e > 0) {                                                                \
            for (int64_t c = 0; c < C; c++) smooth -= lp[c];                           \
            smooth /= (double)C;                                                       \
        }                                                                              \
        double l = j->e > 0 ? (1 - j->e) * nll + j->e * smooth : nll;                  \
        if (x[t] == -INFINITY) { /* no class can be the target if all are -inf */     \
            bool all = true;                                                           \
            for (int64_t c = 0; c < C && all; c++) all = x[c] == -INFINITY;            \
            if (all) l = INFINITY, j->dead[r] = true;                                  \
        }                                                                              \
        j->loss[r] = l;                                                                \
    }

static void ce_forward_rows(void *ctx, int64_t lo, int64_t hi) {
    const ce_job *j = ctx;
    int64_t C = j->C;
    if (j->f64) CE_ROWS(double)
    else CE_ROWS(float)
}

#define CE_GRAD_ROWS(T)                                                                \
    for (int64_t r = lo; r < hi; r++) {                                                \
        T *g = (T *)j->grad + r * C;                                                   \
        int64_t t = j->tgt[r * j->tst];                                                \
        if (t == j->ignore || j->dead[r]) {                                            \
            memset(g, 0, (size_t)C * sizeof(T));                                       \
            continue;                                                                  \
        }                                                                              \
        const T s = (T)j->scale, off = (T)(j->e / (double)C);                          \
        for (int64_t c = 0; c < C; c++) g[c] = (g[c] - off) * s;                       \
        g[t] -= (T)((1 - j->e) * j->scale);                                            \
    }

static void ce_backward_rows(void *ctx, int64_t lo, int64_t hi) {
    const ce_job *j = ctx;
    int64_t C = j->C;
    if (j->f64) CE_GRAD_ROWS(double)
    else CE_GRAD_ROWS(float)
}

static nb_tensor *ce_fwd(nb_function_ctx *ctx, nb_tensor **in, int n, void *user) {
    (void)n;
    const ce_args *a = user;
    nb_tensor *x = nb_contiguous(in[CE_LOGITS]), *tgt = in[CE_TARGETS], *logp = in[CE_LOGP];
    int64_t N = nb_shape(x)[0], C = nb_shape(x)[1];
    nb_tensor *dead = nb_empty(NB_BOOL, NB_SHAPE(N));
    double *loss = malloc((size_t)(N ? N : 1) * sizeof *loss);
    if (!dead || !loss) {
        free(loss);
        return dead ? nn_error("nb_cross_entropy: out of memory") : NULL;
    }
    ce_job j = {.logp = nb_data(logp), .logits = nb_data(x), .tgt = nb_data(tgt),
                .tst = nb_strides(tgt)[0], .C = C, .ignore = a->ignore, .e = a->smoothing,
                .loss = loss, .dead = nb_data(dead), .f64 = nb_dtype_of(x) == NB_F64};
    nb_parallel_for(N, nn_rows_grain(C), ce_forward_rows, &j);
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < N; r++) /* in row order: the same sum for any thread count */
        if (j.tgt[r * j.tst] != a->ignore) sum += loss[r], count++;
    free(loss);
    /* 0 / 0 = NaN when every row is ignored, as torch */
    nb_tensor *out = nb_scalar(nb_dtype_of(x), sum / (double)count);
    if (!out || nb_function_save(ctx, logp) || nb_function_save(ctx, tgt) ||
        nb_function_save(ctx, dead) || nb_function_save(ctx, nb_scalar(NB_I64, (double)count)))
        return NULL;
    return out;
}

/* The fused gradient s * (softmax - e / C - (1 - e) onehot), zero on ignored
 * and dead rows: exp(logp) turned into it in place. */
static nb_tensor *ce_dense_grad(nb_function_ctx *ctx, const ce_args *a, double scale) {
    nb_tensor *logp = nb_function_saved(ctx, 0), *tgt = nb_function_saved(ctx, 1);
    nb_tensor *dead = nb_function_saved(ctx, 2);
    if (!logp || !tgt || !dead) return NULL;
    nb_tensor *g = nb_exp(logp); /* the softmax, a new buffer this rule owns */
    if (!g) return NULL;
    int64_t N = nb_shape(logp)[0], C = nb_shape(logp)[1];
    ce_job j = {.tgt = nb_data(tgt), .tst = nb_strides(tgt)[0], .C = C, .ignore = a->ignore,
                .e = a->smoothing, .dead = nb_data(dead), .grad = nb_data(g), .scale = scale,
                .f64 = nb_dtype_of(g) == NB_F64};
    nb_parallel_for(N, nn_rows_grain(C), ce_backward_rows, &j);
    return g;
}

/* The same as recorded ops on logp and g (create_graph):
 *   (exp(keep ? logp : -inf) - w) * (g / count)
 * keep (N, 1): the rows that count; w (N, C) = keep (e / C + (1 - e) onehot).
 * The rows that do not count stay 0 whatever their logits (inf, NaN). */
static nb_tensor *ce_graph_grad(nb_function_ctx *ctx, const ce_args *a, nb_tensor *g,
                                int64_t count) {
    nb_tensor *logp = nb_function_saved(ctx, 0), *tgt = nb_function_saved(ctx, 1);
    nb_tensor *dead = nb_function_saved(ctx, 2);
    if (!logp || !tgt || !dead) return NULL;
    int64_t N = nb_shape(logp)[0], C = nb_shape(logp)[1];
    nb_dtype dt = nb_dtype_of(logp);
    if (count == 0) return nb_zeros(dt, 2, nb_shape(logp)); /* every row ignored */
    nb_tensor *keep = nb_zeros(NB_BOOL, NB_SHAPE(N, 1)), *w = nb_zeros(NB_F64, NB_SHAPE(N, C));
    if (!keep || !w) return NULL;
    const int64_t *t = nb_data(tgt);
    const bool *d = nb_data(dead);
    bool *k = nb_data(keep);
    double *wv = nb_data(w);
    for (int64_t r = 0; r < N; r++) {
        int64_t tr = t[r * nb_strides(tgt)[0]];
        if (tr == a->ignore || d[r]) continue;
        k[r] = true;
        for (int64_t c = 0; c < C; c++) wv[r * C + c] = a->smoothing / (double)C;
        wv[r * C + tr] += 1 - a->smoothing;
    }
    nb_tensor *p = nb_exp(nb_where(keep, logp, nb_scalar(dt, -INFINITY)));
    return nb_mul(nb_sub(p, nb_to(w, dt)), nb_mul_scalar(g, 1.0 / (double)count));
}

static int ce_bwd(nb_function_ctx *ctx, nb_tensor *gout, nb_tensor **gin, void *user) {
    const ce_args *a = user;
    if (!nb_function_needs_input_grad(ctx, CE_LOGITS)) return 0;
    nb_tensor *count = nb_function_saved(ctx, 3);
    if (!count) return -1;
    if (nb_grad_enabled()) gin[CE_LOGITS] = ce_graph_grad(ctx, a, gout, (int64_t)nb_item(count));
    else gin[CE_LOGITS] = ce_dense_grad(ctx, a, nb_item(gout) / nb_item(count));
    return gin[CE_LOGITS] ? 0 : -1;
}

/* Forward mode: the loss's tangent is <dlogits at g = 1, the logits' tangent> */
static nb_tensor *ce_jvp(nb_function_ctx *ctx, nb_tensor **tin, int n, void *user) {
    (void)n;
    nb_tensor *count = nb_function_saved(ctx, 3), *logp = nb_function_saved(ctx, 0);
    if (!count || !logp) return NULL;
    if (!tin[CE_LOGITS]) return nb_scalar(nb_dtype_of(logp), 0);
    nb_tensor *g1 = ce_dense_grad(ctx, user, 1.0 / nb_item(count));
    return nb_sum_all(nb_mul(g1, tin[CE_LOGITS]));
}

static const nb_function cross_entropy_fn = {.name = "nb_cross_entropy", .forward = ce_fwd,
                                             .backward = ce_bwd, .destroy = free,
                                             .jvp = ce_jvp};

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

    ce_args *a = malloc(sizeof *a);
    if (!a) return nn_error("%s: out of memory", fn);
    *a = (ce_args){.ignore = ignore_index, .smoothing = label_smoothing};
    nb_tensor *logp = nb_log_softmax(logits, 1);
    if (!logp) return free(a), NULL;
    nb_tensor *in[3] = {[CE_LOGITS] = logits, [CE_TARGETS] = targets, [CE_LOGP] = logp};
    nb_tensor *loss = nb_function_apply(&cross_entropy_fn, in, 3, a);
    nb_free(logp);
    return loss;
}

nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *targets, int64_t ignore_index,
                            double label_smoothing) {
    nn_enter();
    return nn_leave("nb_cross_entropy", cross_entropy_body(logits, targets, ignore_index, label_smoothing));
}
